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
import mmap
from typing import Any, Final

import numpy as np

from ._image import Image, describe, pillow

DEFAULT_MAX_PIXELS: Final = 89_478_485
"""Pillow's own bomb limit: about 9,459 x 9,459 pixels."""

DEFAULT_MAX_BYTES: Final = 64 * 2**20

DEFAULT_MAX_SCANS: Final = 100
"""A JPEG's scans: a progressive one's decoding makes a pass over the whole image for each,
12-16 bytes of file apiece, so a small file of many is a bomb of decoding time. Encoders write
1-3 (baseline) or about 10 (progressive); libjpeg-turbo suggests a limit for untrusted
files, as its ``djpeg -maxscans`` takes."""

_SOS: Final = b"\xff\xda"
"""A JPEG's start-of-scan marker (0xFF cannot start a marker inside a scan's data: it is
stuffed there), counted in a thumbnail of its metadata too."""

FORMATS: Final = ("JPEG", "PNG", "WEBP")
"""The Pillow formats Decode opens; no other plugin is tried."""

_SIXTEEN_BIT: Final = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})

try:
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - the fallback is Pillow
    _simplejpeg = None


_PROGRESSIVE: Final = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
"""The start-of-frame markers of progressive JPEGs (Huffman and arithmetic coded)."""


def _progressive(data: memoryview) -> bool:
    """Whether the JPEG's frame (its first start-of-frame segment) is progressive: the
    segments before it are walked by their lengths; anything malformed is left to the
    decoder."""
    at, end = 2, len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return False
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte before a marker
            at += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # start of frame
            return marker in _PROGRESSIVE
        if marker == 0xDA:  # a scan before any frame
            return False
        at += 2 + (data[at + 2] << 8 | data[at + 3])
    return False


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
        max_scans: JPEGs of more scans are refused before decoding, with a ``ValueError``:
            each scan of a progressive JPEG costs a pass over the whole image (1,000 of them,
            41 KB, took 2.2 s at 2048x2048). ``None``: no limit.

    Raises:
        ImportError: Pillow is not installed (when the step is built).
    """

    def __init__(
        self,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        max_scans: int | None = DEFAULT_MAX_SCANS,
    ) -> None:
        limits = (("max_pixels", max_pixels), ("max_bytes", max_bytes), ("max_scans", max_scans))
        for name, value in limits:
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"Decode: {name} must be a positive int or None, got {value!r}")
        self.max_pixels = max_pixels
        self.max_bytes = max_bytes
        self.max_scans = max_scans
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
        jpeg = bytes(data[:3]) == b"\xff\xd8\xff"
        if jpeg and self.max_scans is not None:
            self._check_scans(index, item, data, self.max_scans)
        if _simplejpeg is not None and jpeg:
            return self._jpeg(index, data)
        return self._pillow(index, data)

    @staticmethod
    def _check_scans(index: int, item: Any, data: memoryview, limit: int) -> None:
        if not _progressive(data):
            return  # a sequential JPEG of more scans than components is refused at once
        # bytes, bytearray and mmap search in place; anything else is searched in a copy.
        found = item if isinstance(item, (bytes, bytearray, mmap.mmap)) else data.tobytes()
        at, scans = found.find(_SOS), 0
        while at >= 0:
            scans += 1
            if scans > limit:
                raise ValueError(
                    f"Decode: item {index} is a JPEG of more than max_scans={limit} scans "
                    "(each one a pass over the whole image)"
                )
            at = found.find(_SOS, at + 2)

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
        return (
            f"Decode(max_pixels={self.max_pixels}, max_bytes={self.max_bytes}, "
            f"max_scans={self.max_scans})"
        )
