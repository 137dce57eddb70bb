"""A Parquet file's footer, read twice over: by pyarrow, for its reader, and here, for the
checks made before a row group is read.

pyarrow's accessors of a column chunk's metadata (``RowGroupMetaData.column``, ``to_dict``,
the dataset API's statistics) let a C++ exception out of a footer that its reader refuses
cleanly: a size statistic that disagrees with the schema aborts the process ("terminate
called after throwing an instance of 'parquet::ParquetException'"). Its reader catches
them. So what the checks need of each column chunk is read here from the footer's Thrift,
and pyarrow is given the same bytes (read once) for its reader.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Final

from ._thrift import Reader

MAGIC: Final = b"PAR1"

_FIRST_READ: Final = 64 << 10
"""Bytes read at the end of a file first: its footer, length and magic, most often."""

_CODECS: Final = ("UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW")


@dataclass(frozen=True)
class Chunk:
    """What the checks read of one column chunk's metadata."""

    num_values: int
    total_uncompressed_size: int
    data_page_offset: int
    dictionary_page_offset: int | None
    compression: str

    @property
    def has_dictionary_page(self) -> bool:
        return self.dictionary_page_offset is not None


@dataclass(frozen=True)
class Group:
    """What the checks read of one row group's metadata."""

    num_rows: int
    total_byte_size: int
    columns: list[Chunk]


def _int(fields: dict[int, Any], number: int, what: str) -> int:
    value = fields.get(number)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"the footer's {what} is missing")
    return value


def _chunk(value: object) -> Chunk:
    if not isinstance(value, dict) or not isinstance(value.get(3), dict):
        raise ValueError("the footer has a column chunk without its metadata")
    meta: dict[int, Any] = value[3]
    codec = _int(meta, 4, "codec of a column chunk")
    dictionary = meta.get(11)
    return Chunk(
        num_values=_int(meta, 5, "count of values of a column chunk"),
        total_uncompressed_size=_int(meta, 6, "size of a column chunk"),
        data_page_offset=_int(meta, 9, "data page offset of a column chunk"),
        dictionary_page_offset=dictionary if isinstance(dictionary, int) and dictionary else None,
        compression=_CODECS[codec] if 0 <= codec < len(_CODECS) else f"codec {codec}",
    )


def parse_groups(footer: bytes, columns: int) -> list[Group]:
    """The row groups of a footer (the Thrift ``FileMetaData``), each with ``columns``
    column chunks.

    Raises:
        ValueError: It is not such a footer.
    """
    meta = Reader(footer).struct()
    groups = meta.get(4)
    if not isinstance(groups, list):
        raise ValueError("the footer has no row groups")
    out = []
    for group in groups:
        if not isinstance(group, dict) or not isinstance(group.get(1), list):
            raise ValueError("the footer has a row group without its columns")
        chunks = [_chunk(chunk) for chunk in group[1]]
        if len(chunks) != columns:
            raise ValueError(f"the footer has a row group of {len(chunks)} columns, not {columns}")
        out.append(Group(_int(group, 3, "row count"), _int(group, 2, "byte size"), chunks))
    return out


def read_footer(raw: Any) -> bytes:
    """The footer of the Parquet file ``raw`` (seekable), with its length and magic: what
    ``pyarrow.parquet.read_metadata`` reads from a buffer of it.

    Raises:
        ValueError: ``raw`` is too short for one, or has not Parquet's magic at its end.
    """
    size = raw.seek(0, io.SEEK_END)
    if size < 12:
        raise ValueError(f"not a Parquet file ({size} bytes)")
    # One read for most footers (as pyarrow reads them): the end of the file, then the rest.
    end = read_at(raw, size - min(size, _FIRST_READ), min(size, _FIRST_READ))
    length = int.from_bytes(end[-8:-4], "little")
    if end[-4:] != MAGIC:
        raise ValueError("not a Parquet file (no magic at its end, or an encrypted footer)")
    if length > size - 12:
        raise ValueError(f"a footer of {length} bytes in a file of {size}")
    if length + 8 > len(end):
        end = read_at(raw, size - 8 - length, length + 8 - len(end)) + end
    return end[-(length + 8) :]


def read_at(raw: Any, start: int, length: int) -> bytes:
    """``length`` bytes of ``raw`` from ``start``.

    Raises:
        ValueError: The file ended first.
    """
    raw.seek(start)
    data = b""  # a read may give less than it was asked (a shorter range)
    while len(data) < length and (part := raw.read(length - len(data))):
        data += part
    if len(data) != length:
        raise ValueError("the file ended early")
    return data
