"""Fixed test images, encoded with Pillow: a smooth gradient with seeded noise."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image


def picture(height: int = 60, width: int = 80, seed: int = 0) -> np.ndarray[Any, Any]:
    """An HWC uint8 RGB image, the same for the same arguments."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], -1
    )
    noisy = base.astype(np.int64) + rng.integers(-25, 26, base.shape)
    image: np.ndarray[Any, Any] = np.clip(noisy, 0, 255).astype(np.uint8)
    return image


def encode(image: np.ndarray[Any, Any], fmt: str, mode: str | None = None, **options: Any) -> bytes:
    """``image`` encoded as ``fmt`` (``JPEG``, ``PNG``, ``WEBP``) in Pillow ``mode``."""
    pil = Image.fromarray(image)
    if mode is not None:
        pil = pil.convert(mode)
    out = io.BytesIO()
    pil.save(out, fmt, **options)
    return out.getvalue()


class EncodedImages:
    """A sync dataset of ``n`` encoded JPEGs of different pictures."""

    def __init__(self, n: int, height: int = 48, width: int = 64) -> None:
        self.items = [encode(picture(height, width, seed=i), "JPEG", quality=90) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> bytes:
        return self.items[index]
