"""What a Parquet row group decodes to, as far as its footer and its dictionary pages tell,
and what a step of its rows takes once decoded: the bounds ``ParquetShards`` checks against
``max_bytes``. The footer counts the data encoded; runs of repeated values, lists of them and
dictionaries decode to far more.
"""

from __future__ import annotations

from typing import Any, Final

from ._dictionary_page import longest_value
from ._parquet_footer import Group, read_at
from ._tar import ShardError

ROWS_A_STEP: Final = 1024
"""The most rows decoded and made at once (see :func:`rows_a_step`)."""

_WIDTHS: Final = {
    "INT32": 4,
    "FLOAT": 4,
    "INT64": 8,
    "DOUBLE": 8,
    "INT96": 12,
    "BYTE_ARRAY": 4,
}
"""The fewest bytes one value of each physical type decodes to (a string or a binary: its
offset; a fixed-length binary: its length, from the schema)."""

_NARROW: Final = {"INT_8": 1, "UINT_8": 1, "INT_16": 2, "UINT_16": 2}
"""The integers stored as 32 bits that decode to fewer."""


def _names(path: str, name: str) -> bool:
    """Whether ``name`` selects the column at ``path``: it, or a field nested in it."""
    return path == name or path.startswith(name + ".")


def read_columns(meta: Any, columns: list[str] | None) -> list[int] | None:
    """The numbers of the file's columns (``meta``: its pyarrow metadata, for its schema)
    that reading ``columns`` reads (``None``: all of them)."""
    if columns is None:
        return None
    paths = [meta.schema.column(number).path for number in range(meta.num_columns)]
    return [n for n, path in enumerate(paths) if any(_names(path, name) for name in columns)]


def missing_column(meta: Any, columns: list[str] | None) -> str | None:
    """The first of ``columns`` that names no column of the file whose footer is ``meta``
    (pyarrow passes over such a name: a misspelt one would give rows without it)."""
    paths = [meta.schema.column(number).path for number in range(meta.num_columns)]
    for name in columns or ():
        if not any(_names(path, name) for path in paths):
            return name
    return None


def top_names(meta: Any) -> list[str]:
    """The names of the file's columns as its rows have them: a struct's or a list's, not the
    fields inside them (which a dotted name selects)."""
    names: list[str] = meta.schema.to_arrow_schema().names
    return names


def size_read(group: Group, numbers: list[int] | None) -> int:
    """The uncompressed bytes of row group ``group`` (its footer's metadata) that reading
    columns ``numbers`` (:func:`read_columns`) reads."""
    if numbers is None:
        return group.total_byte_size
    return sum(group.columns[number].total_uncompressed_size for number in numbers)


def least_decoded(meta: Any, group: Group, numbers: list[int] | None) -> int:
    """The fewest bytes the columns read of ``group`` decode to, from each one's count of
    values: runs of repeated values, and lists of them, are encoded in a few bytes.

    A column's values in a row (not in lists) decode to at least their width each, nulls
    too; one nested in lists, to at least a byte each (an empty list is counted as a
    value, and has none)."""
    size = 0
    for number in range(meta.num_columns) if numbers is None else numbers:
        column = meta.schema.column(number)
        count = max(group.columns[number].num_values, 0)
        if column.max_repetition_level:
            size += count
        elif column.physical_type == "BOOLEAN":
            size += count // 8  # a bit each
        else:
            width = _NARROW.get(column.converted_type) or _WIDTHS.get(column.physical_type)
            size += count * (width or column.length)
    return size


def rows_a_step(
    meta: Any,
    raw: Any,
    group: Group,
    where: str,
    numbers: list[int] | None,
    limit: int,
) -> int:
    """Rows of row group ``group`` (of the file ``raw`` whose pyarrow metadata is ``meta``;
    ``where`` names it in errors) that decode to at most ``limit``, as far as the
    dictionaries of its string and binary columns tell: a row of such a column is a copy of
    any of its dictionary's values (each dictionary page read once, where its footer's size
    does not bound it already). A column in lists is not bounded so: a row may hold any
    number of its values."""
    longest = 0
    for number in range(meta.num_columns) if numbers is None else numbers:
        chunk, column = group.columns[number], meta.schema.column(number)
        if (
            column.physical_type != "BYTE_ARRAY"
            or column.max_repetition_level
            or not chunk.has_dictionary_page
            or ROWS_A_STEP * chunk.total_uncompressed_size <= limit
        ):
            continue
        start = chunk.dictionary_page_offset
        assert start is not None
        span = chunk.data_page_offset - start
        try:
            if not 0 < span <= limit:
                raise ValueError(f"a dictionary page of {span} bytes")
            longest += longest_value(read_at(raw, start, span), chunk.compression, limit)
        except ValueError as error:
            raise ShardError(f"{where}: column {column.path!r}: {error}") from None
    return max(1, min(ROWS_A_STEP, limit // max(longest, 1)))


def made(batch: Any) -> int:
    """The bytes of ``batch``'s rows once made: a value of a dictionary column counts for
    each row it is in (a row is made with a copy of it)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    size = 0
    for column in batch.columns:
        kind = column.type
        if pa.types.is_dictionary(kind) and (
            pa.types.is_binary(kind.value_type)
            or pa.types.is_string(kind.value_type)
            or pa.types.is_large_binary(kind.value_type)
            or pa.types.is_large_string(kind.value_type)
        ):
            lengths = pc.take(pc.binary_length(column.dictionary), column.indices)
            size += column.indices.nbytes + (pc.sum(lengths).as_py() or 0)
        else:
            size += column.nbytes
    return size
