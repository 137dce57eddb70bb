"""``Decode``: encoded bytes (JPEG, PNG, WebP) to an HWC image, within limits.

Only those three formats are opened: Pillow would otherwise try each of its plugins in turn,
some of which decode more than their header says (an ICO's hidden entry) or run programs
(EPS runs Ghostscript). Each of the three has its size in its header, checked against
``max_pixels`` before any pixel is decoded.

JPEG goes through simplejpeg (libjpeg-turbo) when it is installed: faster than Pillow, with
identical pixels (docs/performance.md). Everything else, and JPEG without simplejpeg, goes
through Pillow.
"""

from __future__ import annotations

import io
from typing import Any, Final

import numpy as np

from ._image import Image, describe, pillow

DEFAULT_MAX_PIXELS: Final = 89_478_485
"""Pillow's own bomb limit: about 9,459 x 9,459 pixels."""

DEFAULT_MAX_BYTES: Final = 64 * 2**20

FORMATS: Final = ("JPEG", "PNG", "WEBP")
"""The Pillow formats Decode opens; no other plugin is tried."""

_SIXTEEN_BIT: Final = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})

try:
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - the fallback is Pillow
    _simplejpeg = None


class Decode:
    """Decode a JPEG, PNG or WebP item into an HWC image (1, 3 or 4 channels).

    Gray images have 1 channel, colour images 3 (RGB), images with alpha 4, all uint8; palette
    and other 8-bit modes become RGB or RGBA. A 16-bit gray PNG keeps its values: one uint16
    channel (:class:`ToFloat` scales it by 65535). Any other format (GIF, BMP, TIFF, ICO,
    EPS, ...) is refused with a ``ValueError``.

    Args:
        max_pixels: Images with more pixels are refused before decoding (decompression
            bombs), with a ``ValueError``. ``None``: no limit.
        max_bytes: Encoded items larger than this are refused. ``None``: no limit.

    Raises:
        ImportError: Pillow is not installed (when the step is built).
    """

    def __init__(
        self,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
    ) -> None:
        for name, value in (("max_pixels", max_pixels), ("max_bytes", max_bytes)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"Decode: {name} must be a positive int or None, got {value!r}")
        self.max_pixels = max_pixels
        self.max_bytes = max_bytes
        # Pillow and its common formats' plugins (imported by its first open otherwise, ~10 ms)
        # are loaded now, not inside the first batch; and a missing Pillow fails here.
        pillow("Decode").preinit()

    def __call__(self, index: int, item: Any) -> Image:
        """Decode ``item`` (any bytes-like object)."""
        try:
            data = memoryview(item)
        except TypeError:
            raise TypeError(f"Decode takes encoded bytes, got {describe(item)}") from None
        if isinstance(item, np.ndarray) and item.ndim > 1:
            raise TypeError(f"Decode takes encoded bytes, got {describe(item)}")
        if self.max_bytes is not None and data.nbytes > self.max_bytes:
            raise ValueError(
                f"Decode: item {index} is {data.nbytes} bytes, over max_bytes={self.max_bytes}"
            )
        if _simplejpeg is not None and bytes(data[:3]) == b"\xff\xd8\xff":
            return self._jpeg(index, data)
        return self._pillow(index, data)

    def _check_pixels(self, index: int, height: int, width: int) -> None:
        if self.max_pixels is not None and height * width > self.max_pixels:
            raise ValueError(
                f"Decode: item {index} is {width}x{height} = {height * width} pixels, over "
                f"max_pixels={self.max_pixels}"
            )

    def _jpeg(self, index: int, data: memoryview) -> Image:
        assert _simplejpeg is not None
        try:
            height, width, _, subsampling = _simplejpeg.decode_jpeg_header(data)
        except ValueError as error:
            raise ValueError(f"Decode: item {index} is not a valid JPEG: {error}") from None
        self._check_pixels(index, height, width)
        try:
            colorspace = "GRAY" if subsampling == "Gray" else "RGB"
            image: Image = _simplejpeg.decode_jpeg(data, colorspace=colorspace)
        except ValueError as error:
            raise ValueError(f"Decode: item {index} is not a valid JPEG: {error}") from None
        return image if image.ndim == 3 else image[:, :, None]

    def _pillow(self, index: int, data: memoryview) -> Image:
        pil = pillow("Decode")
        try:
            opened = pil.open(io.BytesIO(data), formats=FORMATS)  # reads the header only
        except pil.UnidentifiedImageError:
            raise ValueError(
                f"Decode: item {index} cannot be decoded: not a JPEG, PNG or WebP image"
            ) from None
        except (OSError, SyntaxError, pil.DecompressionBombError) as error:
            raise ValueError(f"Decode: item {index} cannot be decoded: {error}") from None
        try:
            with opened:
                width, height = opened.size
                self._check_pixels(index, height, width)
                image = opened
                if image.mode in _SIXTEEN_BIT:
                    array = np.asarray(image).astype(np.uint16, copy=False)
                else:
                    if image.mode not in ("L", "RGB", "RGBA"):
                        has_alpha = "A" in image.getbands() or "transparency" in image.info
                        gray = image.mode == "1"
                        image = image.convert("L" if gray else "RGBA" if has_alpha else "RGB")
                    array = np.asarray(image)
        except (OSError, SyntaxError, pil.DecompressionBombError) as error:
            raise ValueError(f"Decode: item {index} cannot be decoded: {error}") from None
        return array if array.ndim == 3 else array[:, :, None]

    def __repr__(self) -> str:
        return f"Decode(max_pixels={self.max_pixels}, max_bytes={self.max_bytes})"
