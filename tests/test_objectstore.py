"""ObjectStoreDataset on moto's S3 server (started here on 127.0.0.1), MemoryStore, LocalStore."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import LocalStore, MemoryStore

from asyncloader import DataLoader, ObjectStoreDataset, Retry, Template

from .servers import run_moto
from .test_hostile_files import printed_by

CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


def payload(i: int) -> bytes:
    return f"object {i:03d} ".encode() * (i + 1)


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """Bucket ``train``: ``data/000.bin`` ... ``data/011.bin`` (written out of order: listing
    must sort), a shard of them all, and one object elsewhere."""
    objects = {f"data/{i:03d}.bin": payload(i) for i in reversed(range(12))}
    objects["shards/all.bin"] = b"".join(payload(i) for i in range(12))
    objects["other/x.bin"] = b"x"
    # Folder markers, as the S3 console, rclone or Hadoop's S3A write them: empty objects
    # whose keys end in "/" (one of them childless: an empty folder); and an empty object.
    objects.update(
        {"marked/": b"", "marked/a.bin": b"a", "marked/sub/": b"", "marked/sub/b.bin": b"b"}
    )
    objects.update({"marked/empty/": b"", "marked/void": b""})
    with run_moto("train", objects) as moto:
        yield moto.endpoint


def options(endpoint: str) -> dict[str, Any]:
    return {"endpoint": endpoint, "allow_http": True, **CREDENTIALS}


def items(dataset: ObjectStoreDataset, **settings: Any) -> list[Any]:
    out: list[Any] = []
    with DataLoader(dataset, collate_fn=list, **settings) as loader:
        iterator = iter(loader)
        while True:
            try:
                out.extend(bytes(item) for item in next(iterator))
            except StopIteration:
                return out
            except Exception as error:
                out.append(error)


def test_keys_by_url_with_an_endpoint(s3: str) -> None:
    data = ObjectStoreDataset(
        "s3://train/data", Template("{index:03d}.bin"), length=12, **options(s3)
    )
    assert items(data, batch_size=4, num_workers=2, item_concurrency=4) == [
        payload(i) for i in range(12)
    ]


async def test_from_prefix_lists_sorted_keys(s3: str) -> None:
    data = await ObjectStoreDataset.from_prefix("s3://train/data/", **options(s3))
    assert len(data) == 12
    async with DataLoader(data, batch_size=12, collate_fn=list, item_concurrency=6) as loader:
        [batch] = [batch async for batch in loader]
    assert [bytes(item) for item in batch] == [payload(i) for i in range(12)]


async def test_from_prefix_leaves_out_folder_markers(s3: str) -> None:
    # obstore lists "marked/" and "marked/sub/" as "" and "sub" (no trailing slash), which no
    # GET then finds: every epoch failed their places, naming objects that do not exist.
    data = await ObjectStoreDataset.from_prefix("s3://train/marked/", **options(s3))
    assert [data.locations[i] for i in range(len(data))] == ["a.bin", "sub/b.bin", "void"]
    # An empty folder is told from an empty object (which is kept) by a HEAD.
    assert items(data) == [b"a", b"b", b""]


async def test_from_prefix_of_nothing_is_a_clear_error(s3: str) -> None:
    with pytest.raises(FileNotFoundError, match="no object under s3://train/empty"):
        await ObjectStoreDataset.from_prefix("s3://train/empty/", **options(s3))


def test_byte_ranges_read_samples_out_of_one_shard(s3: str) -> None:
    offsets = [0]
    for i in range(12):
        offsets.append(offsets[-1] + len(payload(i)))
    ranges = [("shards/all.bin", offsets[i], len(payload(i))) for i in range(12)]
    data = ObjectStoreDataset("s3://train", ranges, **options(s3))
    assert items(data, batch_size=3, num_workers=2) == [payload(i) for i in range(12)]


def test_missing_keys_and_limits(s3: str) -> None:
    data = ObjectStoreDataset(
        "s3://train",
        ["data/000.bin", "data/nope.bin", "data/011.bin", ("data/011.bin", 0, 500)],
        max_bytes=100,
        **options(s3),
    )
    out = items(data)
    assert out[0] == payload(0)
    assert type(out[1]) is FileNotFoundError
    assert "data/nope.bin" in str(out[1])
    assert type(out[2]) is ValueError
    assert f"{len(payload(11))} bytes, over max_bytes=100" in str(out[2])
    assert type(out[3]) is ValueError


def test_errors_never_show_the_credentials(s3: str) -> None:
    # moto accepts any credentials, so the failure here is a bucket that does not exist.
    secret: dict[str, Any] = {
        "access_key_id": "AKIDSECRET",
        "secret_access_key": "hunter2",
        "region": "us-east-1",
    }
    data = ObjectStoreDataset(
        "s3://missing-bucket",
        ["k"],
        endpoint=s3,
        allow_http=True,
        retry=Retry(0, 0.01, 0.01),
        **secret,
    )
    [error] = items(data)
    assert isinstance(error, OSError)
    assert "hunter2" not in str(error)
    assert "AKIDSECRET" not in str(error)


def test_retry_becomes_obstores_retry_config(s3: str) -> None:
    from asyncloader.datasets._objectstore import _retry_config

    config = _retry_config(Retry(5, 0.25, 2.0))
    assert config["max_retries"] == 5
    assert config["backoff"]["init_backoff"].total_seconds() == 0.25
    assert config["backoff"]["max_backoff"].total_seconds() == 2.0


def test_memory_and_local_stores(tmp_path: Path) -> None:
    memory = MemoryStore()
    for i in range(3):
        obstore.put(memory, f"k/{i}", payload(i))
    assert items(ObjectStoreDataset(memory, Template("k/{index}"), length=3)) == [
        payload(i) for i in range(3)
    ]
    for i in range(3):
        (tmp_path / f"{i}.bin").write_bytes(payload(i))
    local = LocalStore(tmp_path)
    assert items(ObjectStoreDataset(local, [f"{i}.bin" for i in range(3)])) == [
        payload(i) for i in range(3)
    ]
    by_url = ObjectStoreDataset(f"file://{tmp_path}", ["2.bin"])
    assert items(by_url) == [payload(2)]


def test_a_local_store_reads_beneath_its_folder_only(tmp_path: Path) -> None:
    # obstore's LocalStore follows links: a link to a file outside the folder, or to a folder
    # outside it, was read as an object (and listed by from_prefix). Read as FileDataset
    # reads beneath its root: links that stay inside are followed.
    outside, folder = tmp_path / "outside", tmp_path / "data"
    outside.mkdir()
    folder.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (folder / "a.bin").write_bytes(b"abc")
    (folder / "inside").symlink_to(folder / "a.bin")
    (folder / "link").symlink_to(outside / "secret")
    (folder / "dirlink").symlink_to(outside)
    keys = ["a.bin", "inside", "link", "dirlink/secret", ("a.bin", 1, 2)]
    for store in (LocalStore(folder), f"file://{folder}"):
        got = items(ObjectStoreDataset(store, keys), batch_size=1)
        assert got[:2] == [b"abc", b"abc"]
        assert [type(error) for error in got[2:4]] == [PermissionError, PermissionError]
        assert all("leaves root" in str(error) for error in got[2:4])
        assert got[4] == b"bc"
    listed = asyncio.run(ObjectStoreDataset.from_prefix(f"file://{folder}/"))
    assert b"secret" not in items(listed)


def test_a_local_store_of_a_missing_folder_fails_at_construction(tmp_path: Path) -> None:
    # obstore's own GenericError, with its debug dump of the path, came out as it was.
    with pytest.raises(ValueError, match=r"cannot open store .*: Generic LocalFileSystem error"):
        ObjectStoreDataset(f"file://{tmp_path}/missing", ["a"])


def test_a_fifo_in_a_local_store_fails_its_item_instead_of_blocking(tmp_path: Path) -> None:
    """obstore's LocalStore opened it and waited for a writer for ever: in a child."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "ok").write_bytes(b"ok")
    script = f"""
from asyncloader import DataLoader, ObjectStoreDataset
loader = DataLoader(
    ObjectStoreDataset("file://{tmp_path}", ["pipe", "ok"]), collate_fn=list, timeout=20
)
it = iter(loader)
try:
    next(it)
except OSError as error:
    print("refused:", error)
print("next:", bytes(next(it)[0]))
"""
    lines = printed_by(script)
    assert len(lines) == 2, lines
    assert "a FIFO, not a regular file" in lines[0]
    assert lines[1] == "next: b'ok'"


def test_items_share_obstores_buffer(tmp_path: Path) -> None:
    memory = MemoryStore()
    obstore.put(memory, "k", b"abcdef")
    with DataLoader(ObjectStoreDataset(memory, ["k"]), collate_fn=list) as loader:
        [item] = next(iter(loader))
    assert memoryview(item).tobytes() == b"abcdef"
    assert not isinstance(item, bytes)  # obstore's Bytes: no copy into a Python bytes


def test_bad_urls_and_options_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="no supported scheme"):
        ObjectStoreDataset("ftp://x/y?token=abc", ["k"])
    with pytest.raises(TypeError, match="store URL"):
        ObjectStoreDataset(MemoryStore(), ["k"], region="x")
    with pytest.raises(ValueError, match="cannot open store"):
        ObjectStoreDataset("s3://bucket", ["k"], not_an_option=1)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, 0, True, "5"])
def test_a_bad_timeout_fails_at_construction_naming_it(timeout: Any) -> None:
    # -1, 0 and True were taken (a store whose every request timed out at once); nan, inf and
    # "5" failed as obstore's or datetime's errors, which named no setting.
    with pytest.raises((ValueError, TypeError), match="timeout"):
        ObjectStoreDataset("s3://bucket", ["k"], timeout=timeout, region="us-east-1")
    with pytest.raises((ValueError, TypeError), match="timeout"):
        asyncio.run(ObjectStoreDataset.from_prefix("s3://bucket/p", timeout=timeout))


def test_a_timeout_past_what_a_timedelta_holds_waits_as_long_as_one_can() -> None:
    # 1e300 s raised OverflowError from datetime.
    ObjectStoreDataset("s3://bucket", ["k"], timeout=1e300, region="us-east-1")
