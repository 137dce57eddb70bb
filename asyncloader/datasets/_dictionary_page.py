"""The longest value of a Parquet column chunk's dictionary, read from its dictionary page.

A row of a string or binary column with a dictionary is any one of the dictionary's values,
and Arrow decodes it as a copy of that value: rows that all refer to one long value decode to
many times the footer's size of the column. The footer does not say how long the values are;
the dictionary page does. pyarrow does not read a page alone, so its header is read here:
Thrift's compact encoding, walked only as far as a page header needs.
"""

from __future__ import annotations

from typing import Final

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

_Take = dict[int, "list[int] | _Take"]
"""The fields of a struct to read: an i32's values, or a struct's own fields to read."""

_DICTIONARY_PAGE: Final = 2
_MOST_WALKED: Final = 1 << 20
"""Dictionary entries walked one by one, at most; past that, their sizes bound the longest."""


class _Thrift:
    """A reader of Thrift's compact encoding over ``data``; running past its end (or into
    what no writer writes) is a ``ValueError``."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError("a page header cut short")
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("a varint of over 64 bits")

    def integer(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def struct(self, take: _Take, depth: int = 0) -> None:
        """Walk the struct that starts here: each i32 field that ``take`` names has its value
        appended to its list, each struct field it names is walked with its own ``take``;
        every other field is passed over."""
        field = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            field = field + delta if delta else self.integer()
            wanted = take.get(field)
            if isinstance(wanted, list) and kind == 5:
                wanted.append(self.integer())
            elif isinstance(wanted, dict) and kind == 12:
                self.struct(wanted, depth + 1)
            else:
                self.skip(kind, depth)

    def _element(self, kind: int, depth: int) -> None:
        """Pass over one element of a list, set or map (a boolean there is a byte)."""
        if kind in (1, 2):
            self.byte()
        else:
            self.skip(kind, depth + 1)

    def skip(self, kind: int, depth: int) -> None:
        if depth > 16:
            raise ValueError("a page header nested too deep")
        if kind in (1, 2):  # a boolean: in the field's type
            return
        if kind == 3:
            self.at += 1
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.at += 8
        elif kind == 8:
            self.at += self.varint()
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self._element(head & 0x0F, depth)
        elif kind == 11:
            size = self.varint()
            kinds = self.byte() if size else 0
            for _ in range(size):
                self._element(kinds >> 4, depth)
                self._element(kinds & 0x0F, depth)
        elif kind == 12:
            self.struct({}, depth + 1)
        else:
            raise ValueError(f"a field of Thrift type {kind}")
        if self.at > len(self.data):
            raise ValueError("a page header cut short")


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

    header = _Thrift(page)
    kind: list[int] = []
    uncompressed: list[int] = []
    compressed: list[int] = []
    dictionary: list[int] = []
    # The page's type and sizes; in its field 7, the dictionary page's own header, the count
    # of values (field 1).
    header.struct({1: kind, 2: uncompressed, 3: compressed, 7: {1: dictionary}})
    if kind != [_DICTIONARY_PAGE] or len(uncompressed) != 1 or len(compressed) != 1:
        raise ValueError("not a dictionary page")
    size, count = uncompressed[0], dictionary[0] if dictionary else -1
    end = header.at + compressed[0]
    if size < 0 or count < 0 or compressed[0] < 0 or end > len(page):
        raise ValueError("a dictionary page whose sizes do not add up")
    if size > most:
        raise ValueError(f"a dictionary of {size} bytes, over max_bytes={most}")
    if count > _MOST_WALKED or codec not in _CODECS:
        return max(0, size - 4 * count)  # the values' bytes together
    name, body = _CODECS[codec], page[header.at : end]
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
