"""From pixels to model input: ``ToFloat``, ``Normalize``, ``ToCHW``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._image import CHWImage, Image, check_image

Vector = np.ndarray[Any, np.dtype[np.float32]]


def channel_stats(
    owner: str, mean: Sequence[float], std: Sequence[float]
) -> tuple[Vector, Vector, Vector]:
    """``mean``, ``std`` and ``1 / std`` as float32 vectors, checked; errors name ``owner``."""
    try:
        mean_array = np.asarray(mean, dtype=np.float32)
        std_array = np.asarray(std, dtype=np.float32)
    except (TypeError, ValueError):
        message = f"{owner}: mean {mean!r} and std {std!r} must be lists of numbers"
        raise ValueError(message) from None
    if mean_array.shape != std_array.shape or mean_array.ndim != 1:
        raise ValueError(f"{owner}: mean {mean!r} and std {std!r} must be equal-length lists")
    if not np.all(np.isfinite(mean_array)):  # every pixel would come out NaN or infinite
        raise ValueError(f"{owner}: mean must be finite, got {mean!r}")
    if np.any(std_array == 0) or not np.all(np.isfinite(std_array)):
        raise ValueError(f"{owner}: std must be finite and not zero, got {std!r}")
    return mean_array, std_array, (1 / std_array).astype(np.float32)


class ToFloat:
    """A uint8 or uint16 image (HWC or CHW) to float32 in ``[0, 1]`` (divided by 255 or
    65535)."""

    def __call__(self, index: int, item: Any) -> Image:
        """Convert ``item``."""
        if isinstance(item, np.ndarray) and item.dtype == np.uint16 and item.ndim == 3:
            scale = np.float32(65535)
            image = item
        else:
            image = check_image("ToFloat", item, uint8=True, chw=None)
            scale = np.float32(255)
        out: Image = np.divide(image, scale, dtype=np.float32)
        return out.view(CHWImage) if isinstance(image, CHWImage) else out

    def __repr__(self) -> str:
        return "ToFloat()"


class Normalize:
    """``(image - mean) / std`` per channel, on a float image (HWC or CHW).

    Args:
        mean: One value per channel.
        std: One value per channel, none zero.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean, self.std, self._scale = channel_stats("Normalize", mean, std)

    def __call__(self, index: int, item: Any) -> Image:
        """Normalize ``item``."""
        image = check_image("Normalize", item, uint8=False, chw=None)
        chw = isinstance(image, CHWImage)
        channels = image.shape[0] if chw else image.shape[2]
        if channels != len(self.mean):
            raise ValueError(
                f"Normalize has {len(self.mean)} channels' mean and std, the image {channels}"
            )
        shape = (-1, 1, 1) if chw else (1, 1, -1)
        # One new array, scaled in place: the same values as ``(image - mean) * scale``
        # without a second image-sized temporary.
        out: Image = np.subtract(np.asarray(image), self.mean.reshape(shape))
        np.multiply(out, self._scale.reshape(shape), out=out)
        return out.view(CHWImage) if chw else out

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()})"


class ToCHW:
    """An HWC image to channels first (a view; the collator makes the one copy)."""

    def __call__(self, index: int, item: Any) -> Image:
        """Transpose ``item``."""
        image = check_image("ToCHW", item, chw=False)
        out: Image = image.transpose(2, 0, 1).view(CHWImage)
        return out

    def __repr__(self) -> str:
        return "ToCHW()"
