"""Colour conversions: ``ToRGB`` and ``ToGray`` (ITU-R 601-2 luma, as Pillow's ``L``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._image import Image, check_image


class ToRGB:
    """An HWC uint8 image with 1, 3 or 4 channels to 3 (gray repeated, alpha dropped)."""

    def __call__(self, index: int, item: Any) -> Image:
        """Convert ``item``."""
        image = check_image("ToRGB", item, uint8=True)
        channels = image.shape[2]
        if channels == 3:
            return image
        if channels == 1:
            return np.repeat(image, 3, axis=2)
        if channels == 4:
            return image[:, :, :3]
        raise TypeError(f"ToRGB takes 1, 3 or 4 channels, got {channels}")

    def __repr__(self) -> str:
        return "ToRGB()"


class ToGray:
    """An HWC uint8 image to 1 channel: ``L = R * 299/1000 + G * 587/1000 + B * 114/1000``."""

    def __call__(self, index: int, item: Any) -> Image:
        """Convert ``item``."""
        image = check_image("ToGray", item, uint8=True)
        channels = image.shape[2]
        if channels == 1:
            return image
        if channels not in (3, 4):
            raise TypeError(f"ToGray takes 1, 3 or 4 channels, got {channels}")
        rgb = image[:, :, :3].astype(np.uint32)
        # Pillow's integer formula (rounded): the same result as Image.convert("L").
        luma = (rgb[:, :, 0] * 19595 + rgb[:, :, 1] * 38470 + rgb[:, :, 2] * 7471 + 0x8000) >> 16
        return luma.astype(np.uint8)[:, :, None]

    def __repr__(self) -> str:
        return "ToGray()"
