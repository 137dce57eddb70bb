"""A remote object as a seekable file whose reads are range requests (for a Parquet reader,
which reads the footer, then each row group's column chunks)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any


def encoded(what: str, encoding: object) -> OSError | None:
    """Why a range of an object served with ``encoding`` (its ``Content-Encoding``) cannot be
    read, or ``None`` for one without: a range is of the bytes as stored, so of the encoded
    ones (RFC 9110, 14.1.1), which no reader of ranges can use."""
    name = str(encoding or "").strip().lower()
    if name in ("", "identity"):
        return None
    return OSError(
        f"{what}: the object is stored with Content-Encoding {name[:40]!r}, so its ranges are "
        "of the encoded bytes, which a reader of ranges cannot use; store it without one"
    )


class RangeFile(io.RawIOBase):
    """A file of ``size`` bytes; each read is ``get(start, length) -> bytes`` (blocking).

    Args:
        size: The object's size.
        get: Fetches ``length`` bytes from ``start`` (a range GET).
    """

    def __init__(self, size: int, get: Callable[[int, int], Any]) -> None:
        super().__init__()
        self._size, self._get, self._at = size, get, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self._size - self._at)
        if count <= 0:
            return 0
        view = memoryview(self._get(self._at, count))
        buffer[: len(view)] = view
        self._at += len(view)
        return len(view)
