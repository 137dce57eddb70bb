"""The longest value of a Parquet column chunk's dictionary, read from its dictionary page.

A row of a string or binary column with a dictionary is any one of the dictionary's values,
and Arrow decodes it as a copy of that value: rows that all refer to one long value decode to
many times the footer's size of the column. The footer does not say how long the values are;
the dictionary page does. pyarrow does not read a page alone, so its header is read here
(:mod:`._thrift`).
"""

from __future__ import annotations

from typing import Final

from ._thrift import Reader

_CODECS: Final = {
    "UNCOMPRESSED": None,
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "BROTLI": "brotli",
    "ZSTD": "zstd",
    "LZ4_RAW": "lz4_raw",
}
"""Parquet's codecs that Arrow's decompressors read as they are (not LZ4, in Hadoop's
framing)."""

_DICTIONARY_PAGE: Final = 2
_MOST_WALKED: Final = 1 << 20
"""Dictionary entries walked one by one, at most; past that, their sizes bound the longest."""


def longest_value(page: bytes, codec: str, most: int) -> int:
    """The length of the longest value in a dictionary page of a string or binary column
    (``page``: its header and data; ``codec``: the column chunk's compression); for a page of
    over a million values, or in a codec Arrow cannot read alone, a bound on it: the values'
    bytes together.

    Raises:
        ValueError: ``page`` is not a dictionary page of such values, or its values are over
            ``most`` bytes together (they are not decompressed then).
    """
    import pyarrow as pa

    reader = Reader(page)
    header = reader.struct()
    # The page's type and sizes; in its field 7, the dictionary page's own header, the count
    # of values (field 1).
    dictionary = header.get(7)
    kind, size, compressed = header.get(1), header.get(2), header.get(3)
    count = dictionary.get(1) if isinstance(dictionary, dict) else None
    if not (
        kind == _DICTIONARY_PAGE
        and isinstance(size, int)
        and isinstance(compressed, int)
        and isinstance(count, int)
    ):
        raise ValueError("not a dictionary page")
    end = reader.at + compressed
    if size < 0 or count < 0 or compressed < 0 or end > len(page):
        raise ValueError("a dictionary page whose sizes do not add up")
    if size > most:
        raise ValueError(f"a dictionary of {size} bytes, over max_bytes={most}")
    if count > _MOST_WALKED or codec not in _CODECS:
        return max(0, size - 4 * count)  # the values' bytes together
    name, body = _CODECS[codec], page[reader.at : end]
    values = body if name is None else pa.decompress(body, size, codec=name, asbytes=True)
    if len(values) != size:
        raise ValueError("a dictionary page whose sizes do not add up")
    longest = at = 0
    for _ in range(count):  # each value: its length (4 bytes, little-endian), then its bytes
        if at + 4 > size:
            raise ValueError("a dictionary page cut short")
        length = int.from_bytes(values[at : at + 4], "little")
        longest, at = max(longest, length), at + 4 + length
    if at > size:
        raise ValueError("a dictionary page cut short")
    return longest
