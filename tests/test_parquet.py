"""ParquetShards (issue 20, point 3): Parquet files written here with pyarrow, read from files
and moto's S3 server, row group by row group; the same walk as tar shards (order whatever
num_workers, ranks, exact resume); a broken shard fails only its own place."""

from __future__ import annotations

import gzip
import itertools
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncloader import (
    DataLoader,
    FileDataset,
    HttpDataset,
    ObjectStoreDataset,
    ParquetShards,
    Retry,
)
from asyncloader.testing import assert_equal_output_after_checkpoint

from .epochs import outcomes as every_outcome
from .epochs import rank_states
from .servers import FaultServer, run_moto

CREDENTIALS: dict[str, Any] = {
    "access_key_id": "testing",
    "secret_access_key": "testing",
    "region": "us-east-1",
}
SHARDS, ROWS, GROUP = 5, 30, 8


def table(shard: int) -> pa.Table:
    ids = [shard * 1000 + i for i in range(ROWS)]
    return pa.table({"id": ids, "text": [f"row {i}" for i in ids], "score": [i / 2 for i in ids]})


def parquet_bytes(shard: int) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table(shard), sink, row_group_size=GROUP)
    return bytes(sink.getvalue())


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parquet")
    for shard in range(SHARDS):
        (root / f"{shard}.parquet").write_bytes(parquet_bytes(shard))
    return root


def names() -> list[str]:
    return [f"{shard}.parquet" for shard in range(SHARDS)]


def ids(loader: DataLoader) -> list[int]:
    return [row["id"] for batch in loader for row in batch]


def test_rows_come_out_as_dicts_row_group_by_row_group(folder: Path) -> None:
    dataset = ParquetShards(FileDataset(names(), root=folder), interleave=1)
    with DataLoader(dataset, batch_size=7, collate_fn=list) as loader:
        rows = [row for batch in loader for row in batch]
    assert [row["id"] for row in rows] == [s * 1000 + i for s in range(SHARDS) for i in range(ROWS)]
    assert rows[1] == {
        "id": 1,
        "text": "row 1",
        "score": 0.5,
        "__shard__": "0.parquet",
        "__row__": 1,
    }


def test_length_gives_the_loader_a_len(folder: Path) -> None:
    dataset = ParquetShards(FileDataset(names(), root=folder), length=SHARDS * ROWS)
    with DataLoader(dataset, batch_size=7, collate_fn=list) as loader:
        assert len(loader) == 22  # 150 rows
        assert len(ids(loader)) == SHARDS * ROWS
    with pytest.raises(ValueError, match="length must be at least 0"):
        ParquetShards(FileDataset(names(), root=folder), length=-1)


def test_columns_can_be_selected(folder: Path) -> None:
    dataset = ParquetShards(FileDataset(names(), root=folder), columns=["id"])
    with DataLoader(dataset, batch_size=10, collate_fn=list) as loader:
        first = next(iter(loader))[0]
    assert set(first) == {"id", "__shard__", "__row__"}


def test_a_column_that_no_shard_has_fails_each_shard_naming_it(folder: Path) -> None:
    # pyarrow passes over a column it does not find: a misspelt name gave rows without it,
    # the whole epoch, and no error.
    dataset = ParquetShards(FileDataset(names()[:2], root=folder), columns=["id", "txet"])
    with DataLoader(dataset, batch_size=1, collate_fn=list) as loader:
        said = every_outcome(loader, len)
    assert said == [
        f"shard {name}: no column 'txet' (its columns: 'id', 'text', 'score')"
        for name in names()[:2]
    ]


def test_a_missing_column_is_said_among_the_names_columns_takes(tmp_path: Path) -> None:
    # The message listed the file's leaf fields: a struct's and a list's insides ('width',
    # 'element') and not the names a row has and `columns` takes ('size', 'tags').
    table = pa.table({"id": [1], "size": [{"width": 2, "height": 3}], "tags": [["a"]]})
    pq.write_table(table, tmp_path / "nested.parquet")
    dataset = ParquetShards(FileDataset(["nested.parquet"], root=tmp_path), columns=["width"])
    with DataLoader(dataset, batch_size=1, collate_fn=list) as loader:
        said = every_outcome(loader, len)
    assert said == ["shard nested.parquet: no column 'width' (its columns: 'id', 'size', 'tags')"]
    dataset = ParquetShards(FileDataset(["nested.parquet"], root=tmp_path), columns=["size.width"])
    with DataLoader(dataset, batch_size=1, collate_fn=list) as loader:
        assert [row["size"] for batch in loader for row in batch] == [{"width": 2}]


def test_a_column_named_as_a_rows_place_fails_its_shard(tmp_path: Path) -> None:
    # The loader's __shard__ and __row__ replaced such columns, silently, even when selected.
    with_place = pa.table({"id": [1, 2], "__row__": [100, 101], "__shard__": ["x", "y"]})
    pq.write_table(with_place, tmp_path / "0.parquet")
    pq.write_table(table(1), tmp_path / "1.parquet")
    files = FileDataset(["0.parquet", "1.parquet"], root=tmp_path)
    with DataLoader(ParquetShards(files, interleave=1), batch_size=1, collate_fn=list) as loader:
        said = every_outcome(loader, len)
    assert said == [
        "shard 0.parquet: has a column '__row__', the name of the key the loader gives each "
        "row (its place); read the others with columns=[...]",
        *[1] * ROWS,
    ]
    selected = ParquetShards(FileDataset(["0.parquet"], root=tmp_path), columns=["id"])
    with DataLoader(selected, batch_size=2, collate_fn=list) as loader:
        assert [row["__row__"] for batch in loader for row in batch] == [0, 1]
    with pytest.raises(ValueError, match="'__shard__' is the key the loader gives each row"):
        ParquetShards(FileDataset(["0.parquet"], root=tmp_path), columns=["id", "__shard__"])


def test_the_order_is_the_same_whatever_num_workers(folder: Path) -> None:
    runs = []
    for workers in (0, 3):
        dataset = ParquetShards(
            FileDataset(names(), root=folder), interleave=2, shuffle=True, shuffle_buffer=11
        )
        with DataLoader(
            dataset, batch_size=6, num_workers=workers, seed=2, collate_fn=list
        ) as loader:
            runs.append(ids(loader))
    assert runs[0] == runs[1]
    assert sorted(runs[0]) == sorted(s * 1000 + i for s in range(SHARDS) for i in range(ROWS))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_checkpoint_of_parquet_shards_resumes_exactly(folder: Path, mode: str) -> None:
    def make() -> DataLoader:
        dataset = ParquetShards(
            FileDataset(names(), root=folder), interleave=2, shuffle=True, shuffle_buffer=9
        )
        return DataLoader(
            dataset, batch_size=7, seed=5, collate_fn=lambda rows: [r["id"] for r in rows]
        )

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert assert_equal_output_after_checkpoint(make, epochs=2, mode=mode) > 20


def test_ranks_read_disjoint_shards(folder: Path) -> None:
    shares = []
    for rank in range(2):
        dataset = ParquetShards(FileDataset(names(), root=folder), shuffle=True)
        with DataLoader(dataset, batch_size=8, rank=rank, world_size=2, collate_fn=list) as loader:
            shares.append(ids(loader))
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(
        s * 1000 + i for s in range(SHARDS) for i in range(ROWS)
    )


def test_a_broken_shard_fails_its_place_and_the_epoch_goes_on(tmp_path: Path) -> None:
    (tmp_path / "good.parquet").write_bytes(parquet_bytes(0))
    (tmp_path / "text.parquet").write_bytes(b"not parquet at all" * 10)
    (tmp_path / "cut.parquet").write_bytes(parquet_bytes(1)[:-20])
    files = ["text.parquet", "good.parquet", "cut.parquet", "missing.parquet"]
    dataset = ParquetShards(FileDataset(files, root=tmp_path), interleave=1)
    with DataLoader(dataset, batch_size=None, collate_fn=None) as loader:
        outcomes = every_outcome(loader, lambda row: row["id"])
    rows = [o for o in outcomes if not isinstance(o, str)]
    errors = [o for o in outcomes if isinstance(o, str)]
    assert rows == list(range(ROWS))
    assert len(errors) == 3
    for name, message in zip(["text", "cut", "missing"], errors, strict=True):
        assert f"{name}.parquet" in message


def test_a_row_group_over_max_bytes_fails_before_it_is_read(folder: Path) -> None:
    dataset = ParquetShards(FileDataset(names()[:1], root=folder), max_bytes=10)
    loader = DataLoader(dataset, batch_size=4, collate_fn=list)
    with loader, pytest.raises(OSError, match=r"row group 0 is \d+ bytes, over max_bytes=10"):
        next(iter(loader))


def test_max_bytes_counts_only_the_columns_read(tmp_path: Path) -> None:
    # Labels beside images: row groups of 2 MB, nearly all of it a column not read. Every
    # row group was refused under max_bytes=1 MiB by its whole size, the labels never given.
    blobs = [bytes([i]) * 100_000 for i in range(40)]
    labels = pa.table(
        {"label": list(range(40)), "image": blobs, "nested": [{"a": i} for i in range(40)]}
    )
    pq.write_table(labels, tmp_path / "labels.parquet", row_group_size=20, compression="none")
    files = FileDataset(["labels.parquet"], root=tmp_path)
    dataset = ParquetShards(files, columns=["label", "nested"], max_bytes=1 << 20)
    with DataLoader(dataset, batch_size=8, collate_fn=list) as loader:
        rows = [row for batch in loader for row in batch]
    assert [row["label"] for row in rows] == list(range(40))
    assert rows[3]["nested"] == {"a": 3}
    assert "image" not in rows[0]
    whole = ParquetShards(files, max_bytes=1 << 20)  # the image column too: over the limit
    loader = DataLoader(whole, batch_size=8, collate_fn=list)
    with loader, pytest.raises(OSError, match=r"row group 0 is \d+ bytes, over max_bytes"):
        next(iter(loader))


def with_rows_said(data: bytes, said: int) -> bytes:
    """``data`` with its first row group's row count in the footer changed to ``said`` (the
    byte of its zigzag varint, found by trying each candidate until pyarrow reads it)."""
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    rows = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0).num_rows
    value = bytes([0x16, 2 * rows])  # field 3 (i64) after field 2, zigzag-encoded
    at = data.find(value, start)
    while at >= 0:
        changed = bytearray(data)
        changed[at + 1] = 2 * said if said >= 0 else -2 * said - 1
        try:
            meta = pq.ParquetFile(pa.BufferReader(bytes(changed))).metadata
        except OSError:
            meta = None
        if meta is not None and meta.row_group(0).num_rows == said:
            return bytes(changed)
        at = data.find(value, at + 1)
    raise AssertionError("no row count found in the footer")


def test_a_negative_row_count_in_the_footer_fails_the_shard(tmp_path: Path) -> None:
    # A row group whose footer says -20 rows (pyarrow refuses to read it as corrupt) was
    # taken for one to skip: it was passed over, and the next 20 rows of the shard were
    # dropped with it, all silently.
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": list(range(40))}), sink, row_group_size=20)
    (tmp_path / "corrupt.parquet").write_bytes(with_rows_said(bytes(sink.getvalue()), -20))
    dataset = ParquetShards(FileDataset(["corrupt.parquet"], root=tmp_path))
    loader = DataLoader(dataset, batch_size=4, collate_fn=list)
    with loader, pytest.raises(OSError, match="row group 0 has -20 rows"):
        next(iter(loader))


def test_a_row_group_with_fewer_rows_than_its_footer_says_fails_the_shard(
    tmp_path: Path,
) -> None:
    # The footer says 30 rows, the data holds 20 (pyarrow gives the 20): the rows after it
    # were numbered from 30, and a resume skipped 30 rows for it, 10 of the next group's.
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": list(range(40))}), sink, row_group_size=20)
    (tmp_path / "corrupt.parquet").write_bytes(with_rows_said(bytes(sink.getvalue()), 30))
    dataset = ParquetShards(FileDataset(["corrupt.parquet"], root=tmp_path))
    with DataLoader(dataset, batch_size=4, collate_fn=list) as loader:
        got = every_outcome(loader, lambda batch: [row["id"] for row in batch])
    rows = [i for outcome in got if isinstance(outcome, list) for i in outcome]
    assert rows == list(range(20))  # the rows before the fault still come
    errors = [outcome for outcome in got if isinstance(outcome, str)]
    assert len(errors) == 1
    assert "row group 0 gave 20 rows, its footer says 30" in errors[0]


def test_a_row_group_that_decodes_past_max_bytes_fails_as_it_is_read(tmp_path: Path) -> None:
    # 20,000 copies of a 10 KB string: the footer says about 10 KB (one dictionary entry), the
    # file is under 1 KB, and the rows decode to 200 MB: a bomb that the footer's size misses.
    # Its first steps (104 rows, the dictionary page says: within max_bytes) are rows as any.
    bomb = pa.table({"text": pa.array(["x" * 10_000] * 20_000)})
    pq.write_table(bomb, tmp_path / "bomb.parquet", row_group_size=20_000, compression="zstd")
    assert (tmp_path / "bomb.parquet").stat().st_size < 1000
    dataset = ParquetShards(FileDataset(["bomb.parquet"], root=tmp_path), max_bytes=1 << 20)
    tracemalloc.start()
    try:
        with DataLoader(dataset, batch_size=4, collate_fn=list) as loader:
            said = every_outcome(loader, lambda batch: [row["__row__"] for row in batch])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert said[-1] == "shard bomb.parquet: row group 0 decodes to over max_bytes=1048576 bytes"
    assert list(itertools.chain(*said[:-1])) == list(range(4 * (len(said) - 1)))
    assert 4 * (len(said) - 1) <= 104  # the first step's rows, then the error
    assert peak < 16 << 20


PEAK = """
import sys, tracemalloc
import pyarrow as pa
from asyncloader import DataLoader, FileDataset, ParquetShards
dataset = ParquetShards(FileDataset([sys.argv[2]], root=sys.argv[1]), max_bytes=8 << 20)
tracemalloc.start()
with DataLoader(dataset, batch_size=4, collate_fn=list) as loader:
    batches = iter(loader)
    while True:
        try:
            next(batches)
        except StopIteration:
            break
        except OSError as error:
            print(error)
print(max(pa.default_memory_pool().max_memory(), tracemalloc.get_traced_memory()[1]))
"""


def peak_reading(folder: Path, name: str) -> tuple[str, int]:
    """The errors an epoch of ``name`` under ``max_bytes=8 MiB`` gave, and the most memory
    Arrow or Python held meanwhile (in a child: a fresh peak, and a hard time-out for a bomb)."""
    child = subprocess.run(
        [sys.executable, "-c", PEAK, str(folder), name],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    *said, peak = child.stdout.splitlines()
    return "\n".join(said), int(peak)


@pytest.mark.parametrize("arrow_schema", [False, True])
def test_a_dictionary_of_one_long_value_is_not_decoded_past_max_bytes(
    tmp_path: Path, arrow_schema: bool
) -> None:
    # 2,048 rows of one 1 MiB value, dictionary-encoded and compressed: a 6 KB file whose
    # footer truly says 1 MiB. Read 1,024 rows a step, Arrow decoded its first step to 1 GiB;
    # where the file's Arrow schema keeps the dictionary as it is read, a step counted the
    # dictionary once and made its 1,024 rows: 1 GiB, and no error.
    value = pa.array([b"\0" * (1 << 20)], pa.binary())
    rows = pa.DictionaryArray.from_arrays(pa.array([0] * 2048, pa.int32()), value)
    pq.write_table(
        pa.table({"blob": rows}),
        tmp_path / "bomb.parquet",
        compression="zstd",
        dictionary_pagesize_limit=8 << 20,
        store_schema=arrow_schema,
    )
    assert (tmp_path / "bomb.parquet").stat().st_size < 16_000
    said, peak = peak_reading(tmp_path, "bomb.parquet")
    assert said.endswith("row group 0 decodes to over max_bytes=8388608 bytes")
    assert peak < 32 << 20


def test_lists_that_decode_past_max_bytes_fail_before_they_are_read(tmp_path: Path) -> None:
    # 64 rows, each a list of a million zero bytes: a 2 KB file whose footer says 1,506
    # bytes, and 64 MiB of values decoded (Arrow made 584 MiB at once to decode them).
    values = pa.array(np.zeros(64 << 20, np.int8))
    lists = pa.ListArray.from_arrays(pa.array(np.arange(0, (64 << 20) + 1, 1 << 20)), values)
    pq.write_table(pa.table({"x": lists}), tmp_path / "bomb.parquet", compression="zstd")
    assert (tmp_path / "bomb.parquet").stat().st_size < 16_000
    said, peak = peak_reading(tmp_path, "bomb.parquet")
    assert said.endswith(
        "row group 0 decodes to 67108864 bytes at least (64 MiB), over max_bytes=8388608"
    )
    assert peak < 1 << 20  # refused from the footer: nothing decoded


def test_a_row_group_within_max_bytes_is_made_into_rows_a_step_at_a_time(
    tmp_path: Path,
) -> None:
    # A million rows of one int8: 1 MB decoded, within max_bytes, a file of about 4 KB. As
    # Python dicts they are about 230 MB, all made before the first batch until session 18.
    count = 1_000_000
    ones = pa.table({"x": pa.array([7] * count, pa.int8())})
    pq.write_table(ones, tmp_path / "ones.parquet", row_group_size=count)
    dataset = ParquetShards(
        FileDataset(["ones.parquet"], root=tmp_path), buffer=8, max_bytes=8 << 20
    )
    with DataLoader(dataset, batch_size=4, collate_fn=list) as loader:
        tracemalloc.start()
        try:
            batches = iter(loader)
            first = next(batches)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert first == [{"x": 7, "__shard__": "ones.parquet", "__row__": i} for i in range(4)]
        rows = [row["__row__"] for batch in itertools.islice(batches, 3000) for row in batch]
        assert rows == list(range(4, 4 + 4 * 3000))
    assert peak < 16 << 20


FOOTERS = """
import sys
import pyarrow as pa
import pyarrow.parquet as pq
from asyncloader import DataLoader, FileDataset, ParquetShards

folder = sys.argv[1]
texts = [f"v{i % 7}" * (i % 5) for i in range(300)]
table = pa.table({"a": list(range(300)), "s": texts, "l": [[i, i + 1] for i in range(300)]})
sink = pa.BufferOutputStream()
pq.write_table(table, sink, row_group_size=100, compression="snappy")
base = bytes(sink.getvalue())
start = len(base) - 8 - int.from_bytes(base[-8:-4], "little")
names = []
for at in range(start, len(base) - 8):
    for value in (61, 255):
        changed = bytearray(base)
        changed[at] = value
        names.append(f"{at}-{value}.parquet")
        with open(f"{folder}/{names[-1]}", "wb") as file:
            file.write(changed)
dataset = ParquetShards(FileDataset(names, root=folder), max_bytes=1 << 20)
outcomes = []
with DataLoader(dataset, batch_size=512, collate_fn=list) as loader:
    batches = iter(loader)
    while True:
        try:
            outcomes.append(len(next(batches)))
        except StopIteration:
            break
        except OSError:
            outcomes.append("error")
read = sum(n for n in outcomes if n != "error")
print(len(names), "files", outcomes.count("error") > 0, read > 0)
"""


def test_no_footer_one_byte_off_ends_the_process(tmp_path: Path) -> None:
    # Every byte of a footer set to 61, then to 255, each a shard. pyarrow's accessors of a
    # column chunk let a C++ exception out of one of them ("Definition level histogram size
    # mismatch"), which aborted the process (SIGABRT): the checks before a row group is read
    # now read the footer themselves, and pyarrow's reader refuses such a file as any other.
    child = subprocess.run(
        [sys.executable, "-c", FOOTERS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split()[1:] == ["files", "True", "True"], child.stdout


EXITS = """
import sys
from asyncloader import DataLoader, FileDataset, ParquetShards
dataset = ParquetShards(FileDataset(sys.argv[2:], root=sys.argv[1]))
with DataLoader(dataset, batch_size=4, collate_fn=list) as loader:
    next(iter(loader))
"""


@pytest.mark.timeout(180)
def test_a_script_that_stops_reading_exits_cleanly(folder: Path) -> None:
    # A shard is closed on a thread of its own once its epoch is left; the interpreter's exit
    # ended such a thread inside pyarrow's C++ code, which aborted the process (SIGABRT) in 5
    # of 20 runs. Sixteen at once: one such exit all but certain to show.
    children = [
        subprocess.Popen(
            [sys.executable, "-c", EXITS, str(folder), *names()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(16)
    ]
    ended = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0] * 16, [err for _, err in ended]


def test_settings_are_checked(folder: Path) -> None:
    with pytest.raises(TypeError, match="open_file"):
        ParquetShards([str(folder / "0.parquet")])
    with pytest.raises(TypeError, match="columns"):
        ParquetShards(FileDataset(names(), root=folder), columns="id")
    with pytest.raises(ValueError, match="columns must name at least one column"):
        ParquetShards(FileDataset(names(), root=folder), columns=[])
    with pytest.raises(ValueError, match="interleave"):
        ParquetShards(FileDataset(names(), root=folder), interleave=0)


@pytest.fixture(scope="module")
def bucket() -> Iterator[str]:
    objects = {f"rows/{shard}.parquet": parquet_bytes(shard) for shard in range(SHARDS)}
    with run_moto("tables", objects) as moto:
        yield moto.endpoint


def test_parquet_shards_on_s3_read_by_ranges(bucket: str) -> None:
    store = ObjectStoreDataset(
        "s3://tables/rows", names(), endpoint=bucket, allow_http=True, **CREDENTIALS
    )
    dataset = ParquetShards(store, interleave=2, columns=["id", "text"])
    with DataLoader(dataset, batch_size=10, num_workers=2, collate_fn=list) as loader:
        got = ids(loader)
    assert sorted(got) == sorted(s * 1000 + i for s in range(SHARDS) for i in range(ROWS))


def chunk_bytes(data: bytes, columns: list[str] | None) -> int:
    """The bytes of the column chunks of ``columns`` (all: ``None``) in a Parquet file."""
    meta = pq.read_metadata(pa.BufferReader(data))
    chunks = (
        meta.row_group(group).column(number)
        for group in range(meta.num_row_groups)
        for number in range(meta.num_columns)
    )
    return sum(
        chunk.total_compressed_size
        for chunk in chunks
        if columns is None or chunk.path_in_schema in columns
    )


def test_stats_count_the_bytes_of_the_shards_read(folder: Path, bucket: str) -> None:
    # Until session 32 a shard stream's statistics said 0 bytes (its items are rows).
    files = [parquet_bytes(shard) for shard in range(SHARDS)]
    store = ObjectStoreDataset(
        "s3://tables/rows", names(), endpoint=bucket, allow_http=True, **CREDENTIALS
    )
    for shards in (FileDataset(names(), root=folder), store):
        for columns in (None, ["id"], ["text", "score"]):
            dataset = ParquetShards(shards, interleave=2, columns=columns)
            with DataLoader(dataset, batch_size=10, collate_fn=list) as loader:
                assert len(list(itertools.chain(*loader))) == SHARDS * ROWS
                read = loader.stats().bytes
            # The footer's read, the last 64 KiB of a file, is the whole of these small
            # files; then the column chunks of the columns read, each once (pyarrow reads
            # them on threads of its own, which see no loader's statistics).
            assert read == sum(len(data) + chunk_bytes(data, columns) for data in files)


def test_a_state_of_two_ranks_resumes_over_three(folder: Path) -> None:
    def make(rank: int, world_size: int) -> DataLoader:
        dataset = ParquetShards(
            FileDataset(names(), root=folder), interleave=2, shuffle=True, shuffle_buffer=6
        )
        return DataLoader(
            dataset, batch_size=5, rank=rank, world_size=world_size, seed=1, collate_fn=list
        )

    states, before = rank_states(make, 2, 2, lambda row: row["id"])
    after = []
    for rank in range(3):
        with make(rank, 3) as restored:
            restored.load_state_dict(states)
            after += ids(restored)
    everything = [s * 1000 + i for s in range(SHARDS) for i in range(ROWS)]
    assert len(before) + len(after) == len(everything)
    assert sorted(before + after) == everything


def test_parquet_shards_over_http_read_by_range_requests(server: FaultServer) -> None:
    for shard in range(SHARDS):
        server.files[f"{shard}.parquet"] = parquet_bytes(shard)
    urls = [f"{server.url}/ranged/{name}" for name in names()]
    dataset = ParquetShards(HttpDataset(urls), interleave=2, columns=["id"])
    with DataLoader(dataset, batch_size=10, num_workers=2, collate_fn=list) as loader:
        got = ids(loader)
    assert sorted(got) == sorted(s * 1000 + i for s in range(SHARDS) for i in range(ROWS))
    assert server.hits[f"/ranged/{names()[0]}"] >= 3  # the size, the footer, the row groups


def test_over_http_the_dictionary_pages_are_read_by_ranges_too(server: FaultServer) -> None:
    # Under max_bytes=50,000, 1,024 rows of a 135-byte text column chunk could pass it: the
    # longest value is read from the dictionary page (a range GET of its own) before the
    # row group, and the rows are the same.
    for shard in range(SHARDS):
        server.files[f"{shard}.parquet"] = parquet_bytes(shard)
    urls = [f"{server.url}/ranged/{name}" for name in names()]
    first = f"/ranged/{names()[0]}"
    before = server.hits[first]
    plain = ParquetShards(HttpDataset(urls), interleave=2)
    with DataLoader(plain, batch_size=10, collate_fn=list) as loader:
        expected = [row for batch in loader for row in batch]
    plain_hits, before = server.hits[first] - before, server.hits[first]
    bounded = ParquetShards(HttpDataset(urls), interleave=2, max_bytes=50_000)
    with DataLoader(bounded, batch_size=10, collate_fn=list) as loader:
        assert [row for batch in loader for row in batch] == expected
    groups = -(-ROWS // GROUP)
    assert server.hits[first] - before == plain_hits + groups  # one more a row group


@pytest.mark.parametrize(
    ("route", "message"),
    [("files", "does not serve byte ranges"), ("wrong-range", "the server sent 'bytes 0-99/")],
)
def test_a_server_that_does_not_answer_the_range_fails_its_shard(
    server: FaultServer, route: str, message: str
) -> None:
    server.files["whole.parquet"] = parquet_bytes(0)
    dataset = ParquetShards(HttpDataset([f"{server.url}/{route}/whole.parquet"]))
    loader = DataLoader(dataset, batch_size=4, collate_fn=list)
    with loader, pytest.raises(OSError, match=message):
        next(iter(loader))


@pytest.mark.parametrize("own", [{}, {"accept-encoding": "gzip"}])
def test_a_shard_stored_gzip_encoded_fails_once_naming_the_encoding(
    server: FaultServer, own: dict[str, str]
) -> None:
    # A range of an object kept with Content-Encoding: gzip is of its gzipped bytes: aiohttp
    # decoded the first byte's range into nothing, and the shard failed, retried 4 times, as
    # "the range ended early". The ranges ask for the object as stored (identity, in place
    # of the user's own header), and a range that comes encoded anyway fails at once.
    name = f"stored-{len(own)}.parquet"
    server.files[name] = parquet_bytes(0)
    retry = Retry(max_retries=3, initial_backoff=0)
    dataset = ParquetShards(HttpDataset([f"{server.url}/encoded/{name}"], headers=own, retry=retry))
    loader = DataLoader(dataset, batch_size=4, collate_fn=list)
    with loader, pytest.raises(OSError, match="stored with Content-Encoding 'gzip', so its ranges"):
        next(iter(loader))
    assert server.hits[f"/encoded/{name}"] == 1
    assert server.accepted[-1] == ["identity"]


def test_an_object_stored_gzip_encoded_in_a_bucket_fails_naming_the_encoding() -> None:
    # obstore gives the stored bytes of a range as they are: the gzipped ones, which failed
    # the shard as "not a Parquet file".
    from obstore.store import S3Store

    with run_moto("encoded", {}) as moto:
        store = S3Store("encoded", endpoint=moto.endpoint, allow_http=True, **CREDENTIALS)
        stored = gzip.compress(parquet_bytes(0), mtime=0)
        obstore.put(store, "t.parquet", stored, attributes={"Content-Encoding": "gzip"})
        dataset = ParquetShards(ObjectStoreDataset(store, ["t.parquet"]))
        loader = DataLoader(dataset, batch_size=4, collate_fn=list)
        with loader, pytest.raises(OSError, match="stored with Content-Encoding 'gzip', so"):
            next(iter(loader))


def versioned(first_id: int, rows: int = 40_000) -> bytes:
    """A Parquet file of 4 row groups whose byte layout depends only on ``rows`` (no
    dictionary, compression or statistics), so another version of it parses at the same offsets."""
    sink = pa.BufferOutputStream()
    ids = pa.table({"id": list(range(first_id, first_id + rows))})
    pq.write_table(
        ids,
        sink,
        row_group_size=rows // 4,
        use_dictionary=False,
        compression="NONE",
        write_statistics=False,
    )
    return bytes(sink.getvalue())


@pytest.mark.parametrize(
    ("etags", "rows"),
    [("strong", 40_000), ("ignored", 40_000), ("none", 40_001)],
)
def test_a_parquet_shard_replaced_while_it_is_read_fails_its_shard(
    server: FaultServer, etags: str, rows: int
) -> None:
    # Read by ranges, a shard is many requests: the object must be the same for all of them.
    # Replaced after the footer was read, its row groups came from the new version, and the
    # loader gave rows of both versions, or of the new one under the old one's size check.
    name = f"replaced-{etags}.parquet"
    server.files[name], server.files[f"{name}.next"] = versioned(0), versioned(10**6, rows)
    url = f"{server.url}/replaced/{etags}/2/{name}"  # the size, the footer, then the new one
    loader = DataLoader(ParquetShards(HttpDataset([url])), batch_size=10_000, collate_fn=list)
    with loader, pytest.raises(OSError, match="changed while it was read"):
        for _ in loader:
            pass


def test_an_object_replaced_while_it_is_read_by_ranges_fails_the_read() -> None:
    from obstore.store import S3Store

    with run_moto("versions", {"t.parquet": versioned(0)}) as moto:
        store = S3Store("versions", endpoint=moto.endpoint, allow_http=True, **CREDENTIALS)
        file = ObjectStoreDataset(store, ["t.parquet"]).open_file(0)  # sized by a HEAD
        obstore.put(store, "t.parquet", versioned(10**6))
        with pytest.raises(OSError, match="changed while it was read"):
            file.read()
