"""What the image transforms pass along: NumPy arrays, channels last until ``ToCHW``.

An image is a 3-D array: ``HWC`` (height, width, channels) or, after :class:`ToCHW`, a
:class:`CHWImage` (an ``ndarray`` subclass that only marks the layout). Each step checks what
it is given and fails the item with a ``TypeError`` naming the step and what it accepts.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

import numpy as np

# NumPy imports its random module on first use: 4-8 ms with the GIL held. Imported here, with
# the package, so that the first batch's random steps do not import it on a CPU thread while
# the other threads and the event loop wait for the GIL.
import numpy.random

from .._augment import epoch_key

Image = np.ndarray[Any, Any]
"""An image: a 3-D NumPy array."""


class CHWImage(np.ndarray):  # type: ignore[type-arg,unused-ignore]
    """An image laid out channels first (``ToCHW``'s output); otherwise a plain ``ndarray``."""


def describe(value: object) -> str:
    """What a step was given, in a few words."""
    if isinstance(value, np.ndarray):
        layout = "CHW" if isinstance(value, CHWImage) else ("HWC" if value.ndim == 3 else "")
        return f"a {layout + ' ' if layout else ''}{value.dtype} array of shape {value.shape}"
    return f"a {type(value).__name__}"


def check_image(
    step: str, value: object, *, uint8: bool | None = None, chw: bool | None = False
) -> Image:
    """``value`` if it is an image this step takes; else a ``TypeError`` saying what it takes.

    Args:
        step: The step's name, for the message.
        value: What the step was given.
        uint8: ``True``: uint8 only; ``False``: floating point only; ``None``: either.
        chw: ``False``: HWC only; ``True``: CHW only; ``None``: either.
    """
    ok = isinstance(value, np.ndarray) and value.ndim == 3
    if ok and uint8 is not None:
        dtype = getattr(value, "dtype", None)
        ok = bool(dtype == np.uint8) if uint8 else bool(np.issubdtype(dtype, np.floating))
    if ok and chw is not None:
        ok = isinstance(value, CHWImage) == chw
    if not ok:
        layout = {False: "HWC ", True: "CHW ", None: ""}[chw]
        kind = {True: "uint8 ", False: "float ", None: ""}[uint8]
        raise TypeError(f"{step} takes a {layout}{kind}image (3-D array), got {describe(value)}")
    assert isinstance(value, np.ndarray)
    return value


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def fill_value(step: str, fill: object) -> int:
    """A uint8 image's new pixels' value, checked: an int in ``[0, 255]`` (else each item
    would fail, or ``1.5`` be taken as 1)."""
    if isinstance(fill, bool) or not isinstance(fill, int) or not 0 <= fill <= 255:
        raise ValueError(f"{step}: fill must be an int in [0, 255] (uint8), got {fill!r}")
    return fill


def salt_value(step: str, salt: object) -> int:
    """A random step's salt, checked: an int >= 0 (it seeds NumPy's generator)."""
    if isinstance(salt, bool) or not isinstance(salt, int) or salt < 0:
        raise ValueError(f"{step}: salt must be an int >= 0, got {salt!r}")
    return salt


def positive_range(step: str, name: str, value: object) -> tuple[float, float]:
    """A ``(low, high)`` pair of finite numbers, ``0 < low <= high``."""
    try:
        low, high = (float(v) for v in value)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise ValueError(f"{step}: {name} must be a (low, high) pair, got {value!r}") from None
    if not (0 < low <= high and math.isfinite(high)):
        raise ValueError(f"{step}: {name} must be finite with 0 < low <= high, got {value!r}")
    return low, high


def pillow(step: str) -> Any:
    """Pillow's ``Image`` module, imported; an ``ImportError`` naming ``step`` without it.

    The steps that need Pillow call it when they are built, so that a missing Pillow fails
    there and its import (~20 ms with the GIL held) is not paid inside the first batch.
    """
    try:
        from PIL import Image as PILImage
        from PIL import ImageFile  # noqa: F401 - what Image.tobytes imports on first use
    except ImportError as error:
        raise ImportError(f"{step} needs Pillow: pip install asyncloader[images]") from error
    return PILImage


def generator(index: int, salt: int) -> np.random.Generator:
    """The generator of item ``index`` for a random step with ``salt``, in this epoch."""
    seed, epoch = epoch_key.get()
    return np.random.default_rng([seed, epoch, index, salt])


def pair(name: str, value: int | tuple[int, int]) -> tuple[int, int]:
    """``(height, width)`` from an int (square) or a pair, each at least 1."""
    if is_int(value):
        result = (value, value)
    elif isinstance(value, tuple | list) and len(value) == 2 and all(map(is_int, value)):
        result = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{name} must be an int or a (height, width) pair, got {value!r}")
    if min(result) < 1:
        raise ValueError(f"{name} must be at least 1, got {value!r}")
    return result
