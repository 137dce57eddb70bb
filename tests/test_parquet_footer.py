"""The footer as the checks read it (``_parquet_footer``) against pyarrow's own reading of
it, and hostile footers (which only ever fail with a ``ValueError``)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader.datasets._parquet_footer import parse_groups, read_footer


def written(codec: str, dictionary: bool) -> bytes:
    texts = [f"word {i % 13}" * (i % 4) for i in range(500)]
    table = pa.table({"n": list(range(500)), "s": texts, "l": [[i] * (i % 3) for i in range(500)]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=128, compression=codec, use_dictionary=dictionary)
    return bytes(sink.getvalue())


@pytest.mark.parametrize("codec", ["none", "snappy", "zstd", "gzip", "lz4"])
@pytest.mark.parametrize("dictionary", [True, False])
def test_the_footer_reads_as_pyarrow_reads_it(codec: str, dictionary: bool) -> None:
    data = written(codec, dictionary)
    footer = read_footer(io.BytesIO(data))
    assert data.endswith(footer)
    meta = pq.read_metadata(pa.BufferReader(footer))
    groups = parse_groups(footer[:-8], meta.num_columns)
    assert len(groups) == meta.num_row_groups == 4
    for number, group in enumerate(groups):
        theirs = meta.row_group(number)
        assert (group.num_rows, group.total_byte_size) == (theirs.num_rows, theirs.total_byte_size)
        for column, chunk in enumerate(group.columns):
            them = theirs.column(column)
            assert chunk.num_values == them.num_values
            assert chunk.total_uncompressed_size == them.total_uncompressed_size
            assert chunk.data_page_offset == them.data_page_offset
            assert chunk.has_dictionary_page == them.has_dictionary_page
            if chunk.has_dictionary_page:
                assert chunk.dictionary_page_offset == them.dictionary_page_offset
            # pyarrow names LZ4_RAW (the codec it writes for "lz4") as it names LZ4.
            assert chunk.compression.replace("LZ4_RAW", "LZ4") == them.compression


def test_files_that_are_not_parquet_are_refused() -> None:
    for data, said in [
        (b"PAR1", "not a Parquet file"),
        (b"x" * 100, "no magic"),
        (b"x" * 92 + (10_000).to_bytes(4, "little") + b"PAR1", "a footer of 10000 bytes"),
    ]:
        with pytest.raises(ValueError, match=said):
            read_footer(io.BytesIO(data))


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 5))
def test_hostile_footers_only_ever_fail_with_a_value_error(footer: bytes, columns: int) -> None:
    try:
        groups = parse_groups(footer, columns)
    except ValueError:
        return
    assert all(len(group.columns) == columns for group in groups)
