"""Geometry: resize, crops, padding and flips of HWC uint8 images.

Resizing goes through Pillow (as torchvision does for PIL images), so results match Pillow's
``Image.resize`` exactly, antialiasing included. Random steps draw from a generator seeded by
``(loader seed, epoch, index, salt)`` (see :mod:`asyncloader._augment`).
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from ._image import (
    Image,
    check_image,
    describe,
    fill_value,
    generator,
    is_int,
    pair,
    pillow,
    positive_range,
    salt_value,
)

_FILTERS: Final = {"bilinear": 2, "bicubic": 3, "nearest": 0}
"""Pillow's resampling filter numbers (Image.Resampling)."""


def _filter(interpolation: str) -> int:
    if interpolation not in _FILTERS:
        raise ValueError(f"interpolation must be one of {sorted(_FILTERS)}, got {interpolation!r}")
    return _FILTERS[interpolation]


def resize(image: Image, height: int, width: int, resample: int) -> Image:
    """``image`` resized to ``height`` x ``width`` with a Pillow filter."""
    from PIL import Image as PILImage  # imported when the step was built (pillow())

    if image.shape[:2] == (height, width):
        return image
    channels = image.shape[2]
    source = PILImage.fromarray(image[:, :, 0] if channels == 1 else image)
    out = np.asarray(source.resize((width, height), resample))
    return out if out.ndim == 3 else out[:, :, None]


def nonempty(step: str, image: Image) -> Image:
    """``image``, unless it has no pixels: nothing to resize, or draw a box in."""
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"{step}: an empty image, {describe(image)}")
    return image


def pad(image: Image, top: int, bottom: int, left: int, right: int, fill: int) -> Image:
    """``image`` with ``fill`` added on each side."""
    if not (top or bottom or left or right):
        return image
    height, width, channels = image.shape
    out = np.full((height + top + bottom, width + left + right, channels), fill, image.dtype)
    out[top : top + height, left : left + width] = image
    return out


class Resize:
    """Resize an HWC uint8 image.

    Args:
        size: An int: the shorter side becomes ``size``, the aspect ratio is kept (the longer
            side is truncated, as torchvision does). A ``(height, width)`` pair: that size.
        interpolation: ``"bilinear"`` (default), ``"bicubic"`` or ``"nearest"``.

    Raises:
        ImportError: Pillow is not installed (when the step is built).
    """

    def __init__(self, size: int | tuple[int, int], interpolation: str = "bilinear") -> None:
        self.size = size
        self.shorter = isinstance(size, int)
        self.target = pair("Resize size", size)
        self.interpolation = interpolation
        self.resample = _filter(interpolation)
        pillow("Resize")  # imported now, not inside the first batch; fails here without Pillow

    def __call__(self, index: int, item: Any) -> Image:
        """Resize ``item``."""
        image = nonempty("Resize", check_image("Resize", item, uint8=True))
        height, width = image.shape[:2]
        if self.shorter:
            short = self.target[0]
            if height <= width:
                size = (short, int(short * width / height))
            else:
                size = (int(short * height / width), short)
        else:
            size = self.target
        return resize(image, size[0], size[1], self.resample)

    def __repr__(self) -> str:
        return f"Resize({self.size!r}, interpolation={self.interpolation!r})"


def center_crop(image: Image, height: int, width: int) -> Image:
    """The centre ``height`` x ``width`` of ``image``, zero-padded first if it is smaller."""
    h, w = image.shape[:2]
    if h < height or w < width:  # torchvision pads (centred) with zeros, then crops
        top, left = max(0, (height - h) // 2), max(0, (width - w) // 2)
        image = pad(image, top, max(0, height - h - top), left, max(0, width - w - left), fill=0)
        h, w = image.shape[:2]
    top = round((h - height) / 2.0)
    left = round((w - width) / 2.0)
    return image[top : top + height, left : left + width]


class CenterCrop:
    """The centre of an HWC uint8 image (zero-padded when smaller, as torchvision does).

    Args:
        size: An int (square) or ``(height, width)``.
    """

    def __init__(self, size: int | tuple[int, int]) -> None:
        self.size = pair("CenterCrop size", size)

    def __call__(self, index: int, item: Any) -> Image:
        """Crop ``item``."""
        return center_crop(check_image("CenterCrop", item, uint8=True), *self.size)

    def __repr__(self) -> str:
        return f"CenterCrop({self.size!r})"


class RandomCrop:
    """A random ``size`` crop of an HWC uint8 image, zero-padded first if it is smaller.

    Args:
        size: An int (square) or ``(height, width)``.
        salt: Distinguishes this step's draws from another random step's of the same class.
    """

    def __init__(self, size: int | tuple[int, int], salt: int = 0x5EED01) -> None:
        self.size = pair("RandomCrop size", size)
        self.salt = salt_value("RandomCrop", salt)

    def __call__(self, index: int, item: Any) -> Image:
        """Crop ``item`` at a position drawn for this item and epoch."""
        image = check_image("RandomCrop", item, uint8=True)
        height, width = self.size
        h, w = image.shape[:2]
        image = pad(image, 0, max(0, height - h), 0, max(0, width - w), fill=0)
        h, w = image.shape[:2]
        rng = generator(index, self.salt)
        top = int(rng.integers(0, h - height + 1))
        left = int(rng.integers(0, w - width + 1))
        return image[top : top + height, left : left + width]

    def __repr__(self) -> str:
        return f"RandomCrop({self.size!r})"


def resized_crop_box(
    rng: np.random.Generator,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` as torchvision's ``RandomResizedCrop.get_params`` draws it."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        wide, high = math.sqrt(target_area * aspect), math.sqrt(target_area / aspect)
        if not (wide < width + 1 and high < height + 1):  # nor can an infinite side be rounded
            continue
        w, h = round(wide), round(high)
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    # Fallback to a central crop of the ratio nearest to the image's.
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = max(1, round(w / min(ratio)))  # a ratio far past the image's: a 1-pixel strip
    elif in_ratio > max(ratio):
        h = height
        w = max(1, round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class RandomResizedCrop:
    """A random area and aspect ratio of the image, resized to ``size`` (torchvision's).

    Args:
        size: An int (square) or ``(height, width)``.
        scale: The range of the crop's area, as a fraction of the image's.
        ratio: The range of the crop's aspect ratio (width / height).
        interpolation: ``"bilinear"`` (default), ``"bicubic"`` or ``"nearest"``.
        salt: Distinguishes this step's draws from another random step's of the same class.

    Raises:
        ImportError: Pillow is not installed (when the step is built).
    """

    def __init__(
        self,
        size: int | tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        interpolation: str = "bilinear",
        salt: int = 0x5EED02,
    ) -> None:
        self.size = pair("RandomResizedCrop size", size)
        self.scale = positive_range("RandomResizedCrop", "scale", scale)
        self.ratio = positive_range("RandomResizedCrop", "ratio", ratio)
        self.interpolation = interpolation
        self.resample = _filter(interpolation)
        self.salt = salt_value("RandomResizedCrop", salt)
        pillow("RandomResizedCrop")  # imported now, not inside the first batch

    def __call__(self, index: int, item: Any) -> Image:
        """Crop and resize ``item`` with a box drawn for this item and epoch."""
        image = nonempty("RandomResizedCrop", check_image("RandomResizedCrop", item, uint8=True))
        top, left, h, w = resized_crop_box(
            generator(index, self.salt), image.shape[0], image.shape[1], self.scale, self.ratio
        )
        crop = image[top : top + h, left : left + w]
        return resize(crop, self.size[0], self.size[1], self.resample)

    def __repr__(self) -> str:
        return f"RandomResizedCrop({self.size!r}, scale={self.scale}, ratio={self.ratio})"


class Pad:
    """Pad an HWC uint8 image with ``fill`` (torchvision's ``padding`` convention).

    Args:
        padding: An int (every side), ``(left/right, top/bottom)`` or
            ``(left, top, right, bottom)``.
        fill: The value of the new pixels.
    """

    def __init__(self, padding: int | tuple[int, ...], fill: int = 0) -> None:
        values = (padding,) if isinstance(padding, int) else tuple(padding)
        if len(values) not in (1, 2, 4) or any(not is_int(v) or v < 0 for v in values):
            raise ValueError(f"Pad: padding must be 1, 2 or 4 non-negative ints, got {padding!r}")
        if len(values) == 1:
            values = values * 4
        elif len(values) == 2:
            values = (values[0], values[1], values[0], values[1])
        self.left, self.top, self.right, self.bottom = values
        self.fill = fill_value("Pad", fill)

    def __call__(self, index: int, item: Any) -> Image:
        """Pad ``item``."""
        image = check_image("Pad", item, uint8=True)
        return pad(image, self.top, self.bottom, self.left, self.right, self.fill)

    def __repr__(self) -> str:
        return f"Pad(({self.left}, {self.top}, {self.right}, {self.bottom}), fill={self.fill})"


class PadTo:
    """Pad an HWC uint8 image at the bottom and right to ``(height, width)``.

    So images of different sizes can share a batch. A larger image fails its item.
    """

    def __init__(self, height: int, width: int, fill: int = 0) -> None:
        self.height, self.width = pair("PadTo size", (height, width))
        self.fill = fill_value("PadTo", fill)

    def __call__(self, index: int, item: Any) -> Image:
        """Pad ``item``."""
        image = check_image("PadTo", item, uint8=True)
        h, w = image.shape[:2]
        if h > self.height or w > self.width:
            raise ValueError(
                f"PadTo({self.height}, {self.width}) got a larger {h}x{w} image (item {index})"
            )
        return pad(image, 0, self.height - h, 0, self.width - w, self.fill)

    def __repr__(self) -> str:
        return f"PadTo({self.height}, {self.width}, fill={self.fill})"


class HFlip:
    """Mirror an HWC image left to right."""

    def __call__(self, index: int, item: Any) -> Image:
        """Flip ``item``."""
        return check_image("HFlip", item)[:, ::-1]

    def __repr__(self) -> str:
        return "HFlip()"


class VFlip:
    """Mirror an HWC image top to bottom."""

    def __call__(self, index: int, item: Any) -> Image:
        """Flip ``item``."""
        return check_image("VFlip", item)[::-1]

    def __repr__(self) -> str:
        return "VFlip()"


class RandomHorizontalFlip:
    """Mirror an HWC image left to right with probability ``p`` (drawn per item and epoch)."""

    def __init__(self, p: float = 0.5, salt: int = 0x5EED03) -> None:
        number = int | float | np.integer | np.floating
        if isinstance(p, bool) or not isinstance(p, number) or not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be a number in [0, 1], got {p!r}")
        self.p = float(p)
        self.salt = salt_value("RandomHorizontalFlip", salt)

    def __call__(self, index: int, item: Any) -> Image:
        """Flip ``item``, or not."""
        image = check_image("RandomHorizontalFlip", item)
        return image[:, ::-1] if generator(index, self.salt).random() < self.p else image

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"
