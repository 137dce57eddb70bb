"""Thrift's compact encoding, read into plain values: what a Parquet footer and page header
are written in. Read here, not through pyarrow, where pyarrow's own readers cannot be
trusted with hostile bytes (see :mod:`._parquet_footer`).

A struct becomes a dict of its fields by number; a list or a set a list; a map a list of
pairs; a binary ``bytes``; integers ``int``; a double is passed over (``None``). Running
past the end, nesting past 16 levels or a type no writer writes is a ``ValueError``, so
hostile bytes only ever fail that way, in time bounded by their length.
"""

from __future__ import annotations

from typing import Any, Final

_DEPTH: Final = 16


class Reader:
    """A reader of Thrift's compact encoding over ``data``, from ``at``."""

    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data, self.at = data, at

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError("Thrift data cut short")
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
                raise ValueError("a Thrift varint of over 64 bits")

    def integer(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def struct(self, depth: int = 0) -> dict[int, Any]:
        """The struct that starts here, as a dict of its fields by number."""
        if depth > _DEPTH:
            raise ValueError("Thrift data nested too deep")
        fields: dict[int, Any] = {}
        field = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            field = field + delta if delta else self.integer()
            if kind in (1, 2):  # a boolean field: its value is its type
                fields[field] = kind == 1
            else:
                fields[field] = self.value(kind, depth)

    def value(self, kind: int, depth: int) -> Any:
        """One value of Thrift type ``kind`` (in a list, set or map: a boolean is a byte)."""
        if kind in (1, 2):
            return self.byte() == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.integer()
        if kind == 7:
            self._skip(8)
            return None
        if kind == 8:
            size = self.varint()
            start = self.at
            self._skip(size)
            return self.data[start : self.at]
        if kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            return [self.value(head & 0x0F, depth + 1) for _ in range(size)]
        if kind == 11:
            size = self.varint()
            kinds = self.byte() if size else 0
            return [
                (self.value(kinds >> 4, depth + 1), self.value(kinds & 0x0F, depth + 1))
                for _ in range(size)
            ]
        if kind == 12:
            return self.struct(depth + 1)
        raise ValueError(f"a field of Thrift type {kind}")

    def _skip(self, count: int) -> None:
        self.at += count
        if self.at > len(self.data):
            raise ValueError("Thrift data cut short")
