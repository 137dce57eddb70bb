"""The longest value of a Parquet dictionary page, read from pages pyarrow wrote, and from
hostile bytes (which only ever fail with a ``ValueError``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader.datasets._dictionary_page import longest_value


def dictionary_pages(path: Path) -> list[tuple[bytes, str]]:
    """Each string or binary column chunk's dictionary page in the file, and its codec."""
    data, meta = path.read_bytes(), pq.ParquetFile(path).metadata
    pages = []
    for group in range(meta.num_row_groups):
        for number in range(meta.num_columns):
            chunk = meta.row_group(group).column(number)
            if meta.schema.column(number).physical_type == "BYTE_ARRAY":
                assert chunk.has_dictionary_page
                page = data[chunk.dictionary_page_offset : chunk.data_page_offset]
                pages.append((page, chunk.compression))
    return pages


@pytest.mark.parametrize("codec", ["none", "snappy", "gzip", "brotli", "zstd", "lz4"])
def test_the_longest_value_is_the_dictionarys_longest(tmp_path: Path, codec: str) -> None:
    words = [b"x" * (n * 37 % 1000) for n in range(300)]
    table = pa.table({"blob": pa.array(words * 3, pa.binary()), "text": ["ab", "abcd"] * 450})
    pq.write_table(table, tmp_path / "t.parquet", compression=codec, row_group_size=300)
    pages = dictionary_pages(tmp_path / "t.parquet")
    assert len(pages) == 6
    longest = [longest_value(page, compression, 1 << 20) for page, compression in pages]
    if codec == "lz4":  # Hadoop's framing, which Arrow reads only inside a column: a bound
        assert longest == [sum(map(len, words)), 6] * 3
    else:
        assert longest == [999, 4] * 3


def test_a_page_that_is_not_a_dictionary_page_is_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["a", "bb"]}), tmp_path / "t.parquet")
    ((page, codec),) = dictionary_pages(tmp_path / "t.parquet")
    for bad, said, most in [
        (page[:3], "cut short", 1 << 20),
        (page[: len(page) - 1], "do not add up", 1 << 20),
        (b"\x15\x00\x15\x04\x15\x04\x00", "not a dictionary page", 1 << 20),  # a data page
        (page, "a dictionary of 11 bytes, over max_bytes=3", 3),
    ]:
        with pytest.raises(ValueError, match=said):
            longest_value(bad, codec, most)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["UNCOMPRESSED", "SNAPPY", "ZSTD"]))
def test_hostile_bytes_only_ever_fail_with_a_value_error(page: bytes, codec: str) -> None:
    try:
        longest = longest_value(page, codec, 1 << 20)
    except (ValueError, OSError):  # pyarrow's decompressors raise OSError on bad input
        return
    assert 0 <= longest <= 1 << 20
