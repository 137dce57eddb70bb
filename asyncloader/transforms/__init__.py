"""Image transforms: decode and augment on the loader's CPU pool, collate into reused memory.

Each step is a per-item transform ``f(index, image) -> image`` (chain them with
:class:`Compose`). Images are NumPy arrays, ``HWC`` uint8 until :class:`ToFloat`, channels
first after :class:`ToCHW`; a step given what it cannot take fails its item with a
``TypeError`` naming the step and what it accepts. Random steps draw from a generator seeded
by ``(loader seed, epoch, index)``, so an epoch's augmentation is reproducible whatever the
threads. :class:`ImageCollator` copies a batch once into one contiguous array, and can
normalize it as it copies, so that each item stays uint8 until then.

Typical::

    transform = Compose([Decode(), RandomResizedCrop(224), RandomHorizontalFlip()])
    collate_fn = ImageCollator(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])

which gives the batches of ``Compose([..., ToFloat(), Normalize(mean, std), ToCHW()])``
with ``ImageCollator()``, bit for bit, at a higher rate (docs/performance.md).
"""

from .._transform import Compose as Compose
from ._collator import ImageCollator as ImageCollator
from ._color import ToGray as ToGray
from ._color import ToRGB as ToRGB
from ._decode import Decode as Decode
from ._geometry import CenterCrop as CenterCrop
from ._geometry import HFlip as HFlip
from ._geometry import Pad as Pad
from ._geometry import PadTo as PadTo
from ._geometry import RandomCrop as RandomCrop
from ._geometry import RandomHorizontalFlip as RandomHorizontalFlip
from ._geometry import RandomResizedCrop as RandomResizedCrop
from ._geometry import Resize as Resize
from ._geometry import VFlip as VFlip
from ._image import CHWImage as CHWImage
from ._tensor import Normalize as Normalize
from ._tensor import ToCHW as ToCHW
from ._tensor import ToFloat as ToFloat

__all__ = [
    "CHWImage",
    "CenterCrop",
    "Compose",
    "Decode",
    "HFlip",
    "ImageCollator",
    "Normalize",
    "Pad",
    "PadTo",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToCHW",
    "ToFloat",
    "ToGray",
    "ToRGB",
    "VFlip",
]
