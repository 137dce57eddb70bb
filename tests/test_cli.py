"""``asyncloader bench`` against a local server, a moto bucket and a folder, and its errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .servers import FaultServer, run_moto

ROOT = Path(__file__).parent.parent
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run(
        [sys.executable, "-m", "asyncloader", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**base, **(env or {})},
    )


def items_read(output: str) -> int:
    match = re.search(r"^(\d+) items in [\d.]+ s: [\d,]+ items/s, [\d,.]+ MB/s", output, re.M)
    assert match, output
    return int(match.group(1))


@pytest.fixture(scope="module")
def bucket() -> Iterator[str]:
    objects = {f"train/{i:03d}.bin": bytes(100) for i in range(40)}
    with run_moto("bench", objects) as moto:
        yield moto.endpoint


def test_bench_an_http_source(server: FaultServer) -> None:
    result = cli("bench", server.url + "/echo/{index}", "--items", "50", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert items_read(result.stdout) == 50
    assert re.search(r"^(fetch|consumer|transform|collate)-bound: ", result.stdout, re.M)
    assert "suggested: " in result.stdout
    assert "fetch latency p50" in result.stdout


def test_the_suggestion_is_the_options_of_the_next_run(server: FaultServer) -> None:
    # Until session 33 the line repeated the report's advice in the loader's terms.
    url = server.url + "/echo/{index}"
    one = cli("bench", url, "--items", "20", "--num-workers", "1", "--item-concurrency", "1")
    assert one.returncode == 0, one.stderr
    assert "fetch-bound: 1 requests in flight at peak" in one.stdout
    assert "suggested: --item-concurrency 2 (2 requests in flight, 1 now)" in one.stdout
    # 3 items cannot fill 64 requests in flight: more would not be used.
    few = cli("bench", url, "--items", "3", "--no-progress")
    assert few.returncode == 0, few.stderr
    assert "suggested: none of the loader's settings: 3 of its 64 requests" in few.stdout


def test_bench_a_bucket_prefix(bucket: str) -> None:
    result = cli(
        "bench",
        "s3://bench/train/",
        "--endpoint",
        bucket,
        "--allow-http",
        "--region",
        "us-east-1",
        "--no-progress",
        env=CREDENTIALS,
    )
    assert result.returncode == 0, result.stderr
    assert items_read(result.stdout) == 40
    assert "0.0 MiB" in result.stdout or "MiB" in result.stdout


@pytest.mark.parametrize("mapped", [[], ["--mmap"]])
def test_bench_a_folder_with_a_progress_bar(tmp_path: Path, mapped: list[str]) -> None:
    for i in range(30):
        (tmp_path / f"{i}.bin").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "more.bin").write_bytes(b"y" * 10)
    result = cli("bench", str(tmp_path), "--seconds", "30", *mapped)
    assert result.returncode == 0, result.stderr
    assert items_read(result.stdout) == 31
    assert "31/31" in result.stderr  # tqdm's bar, on stderr
    rate = re.search(r"([\d.]+) MB/s", result.stdout)
    assert rate is not None, result.stdout
    assert float(rate.group(1)) > 0, result.stdout  # mapped files' bytes count too


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ftp://host/x"], "ftp:// is not a supported source"),
        (["http://127.0.0.1:1/x"], "{index}"),
        (["http://127.0.0.1:1/{index}"], "--items"),
        (["/nonexistent/folder"], "is not a folder"),
        (["s3://bench/train/"], "no S3 credentials"),
        (["s3://bench/train/", "--num-workers", "-1", "--anonymous"], None),
        # Each of these was taken: nan read the whole source, the rest stopped after a batch.
        (["tests", "--seconds", "nan"], "--seconds"),
        (["tests", "--seconds", "-5"], "--seconds"),
        (["tests", "--seconds", "0"], "--seconds"),
        (["tests", "--items", "0"], "--items"),
        (["tests", "--items", "-3"], "--items"),
        (["tests", "--tar", "--parquet"], "not allowed with"),
        (["tests", "--columns", "a"], "it needs --parquet"),
        (["tests", "--tar", "--columns", "a"], "it needs --parquet"),
    ],
)
def test_bad_sources_exit_with_status_2(args: list[str], message: str | None) -> None:
    result = cli("bench", *args, "--no-progress")
    assert result.returncode == 2, result.stdout + result.stderr
    if message is not None:
        assert message in result.stderr


def test_an_empty_prefix_or_folder_exits_with_status_2(bucket: str, tmp_path: Path) -> None:
    result = cli(
        "bench",
        "s3://bench/nothing/",
        "--endpoint",
        bucket,
        "--allow-http",
        "--region",
        "us-east-1",
        env=CREDENTIALS,
    )
    assert result.returncode == 2
    assert "no object under s3://bench/nothing/" in result.stderr
    empty = cli("bench", str(tmp_path))
    assert empty.returncode == 2
    assert "has no file" in empty.stderr


def test_bench_reads_the_samples_of_tar_shards_in_a_folder(tmp_path: Path) -> None:
    import io
    import tarfile

    for shard in range(3):
        with tarfile.open(tmp_path / f"{shard}.tar", "w") as archive:
            for i in range(20):
                for extension in ("jpg", "cls"):
                    info = tarfile.TarInfo(f"{shard}{i:03d}.{extension}")
                    info.size = 100
                    archive.addfile(info, io.BytesIO(b"s" * 100))
    result = cli("bench", str(tmp_path), "--tar", "--interleave", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "suggested: --interleave 4 (twice the shards read at once)" in result.stdout
    # All 3 shards open at once: more interleave could open no more (it suggested 8).
    every = cli("bench", str(tmp_path), "--tar", "--interleave", "4", "--no-progress")
    assert every.returncode == 0, every.stderr
    assert "suggested: none of the loader's settings: all 3 shards were read at once" in (
        every.stdout
    )
    assert re.search(
        r"^60 samples in [\d.]+ s: [\d,]+ samples/s, ([\d.]+) MB/s", result.stdout, re.M
    )


def test_bench_reads_the_rows_of_parquet_shards_in_a_folder(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for shard in range(3):
        ids = list(range(shard * 20_000, (shard + 1) * 20_000))
        rows = pa.table({"id": ids, "text": [f"row {i}" for i in ids]})
        pq.write_table(rows, tmp_path / f"{shard}.parquet", row_group_size=5_000)
    for columns in ([], ["--columns", "id"], ["--columns", "text,id"]):
        result = cli("bench", str(tmp_path), "--parquet", *columns, "--no-progress")
        assert result.returncode == 0, result.stderr
        rows_read = re.search(r"^60000 rows in [\d.]+ s: [\d,]+ rows/s, ", result.stdout, re.M)
        assert rows_read, result.stdout
        # The shards' bytes read (until session 32, 0 for any shard stream).
        size = re.search(r"batches \d+, ([\d.]+) MiB", result.stdout)
        assert size is not None, result.stdout
        assert float(size.group(1)) > 0, result.stdout
        assert "skipped 0," in result.stdout


def test_bench_piped_into_a_reader_that_leaves_exits_without_a_traceback(tmp_path: Path) -> None:
    # `asyncloader bench ... | head -1`: until session 32 the report's write to the closed
    # pipe ended in a BrokenPipeError traceback.
    (tmp_path / "a.bin").write_bytes(b"x" * 100)
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    reader, writer = os.pipe()
    os.close(reader)  # the reader has gone before anything is written
    try:
        result = subprocess.run(
            [sys.executable, "-m", "asyncloader", "bench", str(tmp_path), "--no-progress"],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=base,
        )
    finally:
        os.close(writer)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
