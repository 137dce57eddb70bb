"""TarShards (issue 20, points 2, 4, 6): WebDataset tar shards, written here with ``tarfile``,
read from files, the HTTP fault server and moto's S3 server; the same samples and keys as the
``webdataset`` package; an order fixed by the shards, the seed and the epoch; broken shards
failing only their own samples."""

from __future__ import annotations

import asyncio
import gc
import io
import os
import tarfile
import tempfile
import threading
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import webdataset
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader import (
    DataLoader,
    FileDataset,
    HttpDataset,
    ObjectStoreDataset,
    Retry,
    SampleError,
    TarShards,
)
from asyncloader.datasets._tar import ShardError
from asyncloader.testing import assert_equal_output_after_checkpoint

from .epochs import outcomes as every_outcome
from .epochs import rank_states
from .servers import FaultServer, run_moto
from .test_streams import Numbers

CREDENTIALS: dict[str, Any] = {
    "access_key_id": "testing",
    "secret_access_key": "testing",
    "region": "us-east-1",
}
SHARDS, PER_SHARD = 6, 7


def member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def shard_bytes(shard: int, count: int = PER_SHARD, compress: bool = False) -> bytes:
    """Shard ``shard``: samples ``{shard:02d}{i:04d}`` with a ``txt`` and a ``cls`` member."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if compress else "w") as archive:
        for i in range(count):
            key = f"{shard:02d}{i:04d}"
            member(archive, f"{key}.txt", f"sample {key}".encode() * (i + 1))
            member(archive, f"{key}.CLS", str(i).encode())
    return out.getvalue()


def keys_of(shard: int, count: int = PER_SHARD) -> list[str]:
    return [f"{shard:02d}{i:04d}" for i in range(count)]


def round_robin(shards: list[int], interleave: int) -> list[str]:
    """The order the issue fixes, computed the plain way."""
    pending = [keys_of(s) for s in shards]
    open_, out, turn = [pending.pop(0) for _ in range(min(interleave, len(pending)))], [], 0
    while open_:
        if not open_[turn]:
            if pending:
                open_[turn] = pending.pop(0)
            else:
                del open_[turn]
                turn = turn if turn < len(open_) else 0
            continue
        out.append(open_[turn].pop(0))
        turn = (turn + 1) % len(open_)
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    write_shards(root, [PER_SHARD] * SHARDS)
    return root


def write_shards(folder: Path, sizes: list[int]) -> None:
    """Shards named as :func:`names` names them, shard ``s`` of ``sizes[s]`` samples."""
    for shard, count in enumerate(sizes):
        (folder / f"shard-{shard:02d}.tar").write_bytes(shard_bytes(shard, count))


def names(count: int = SHARDS) -> list[str]:
    return [f"shard-{shard:02d}.tar" for shard in range(count)]


def key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def keys(loader: DataLoader) -> list[str]:
    return [sample["__key__"] for batch in loader for sample in batch]


def on_files(folder: Path, **settings: Any) -> TarShards:
    return TarShards(FileDataset(names(), root=folder), **settings)


def test_length_gives_the_stream_and_its_loader_a_len_and_changes_nothing_else(
    folder: Path,
) -> None:
    loader = DataLoader(on_files(folder, length=SHARDS * PER_SHARD), batch_size=4, collate_fn=list)
    assert len(loader) == 11  # 42 samples
    assert keys(loader) == keys(DataLoader(on_files(folder), batch_size=4, collate_fn=list))
    with pytest.raises(TypeError, match=r"TarShards is a stream with no len\(\): .*length="):
        len(DataLoader(on_files(folder), batch_size=4))
    for bad, error in (("42", TypeError), (-1, ValueError), (True, TypeError)):
        with pytest.raises(error, match="length"):
            on_files(folder, length=bad)


@pytest.mark.parametrize("shuffle_buffer", [0, 5])
def test_a_stream_longer_than_its_length_resumes_from_every_state_it_saved(
    folder: Path, shuffle_buffer: int
) -> None:
    # length= is the user's count, not the stream's end: 42 samples said to be 20 make 11
    # batches of 4 where len() says 5. The states saved after the sixth to the eleventh were
    # refused when loaded ("batches_received 6 is past the end of its epoch (5)"), so a job
    # whose length was low could not resume from its own checkpoints.
    def make() -> DataLoader:
        shards = on_files(folder, length=20, shuffle=True, shuffle_buffer=shuffle_buffer)
        return DataLoader(shards, batch_size=4, seed=3, collate_fn=list)

    assert len(make()) == 5
    assert assert_equal_output_after_checkpoint(make, epochs=2) == 2 * (11 + 1) + 1


def test_a_sample_is_the_members_that_share_a_key(folder: Path) -> None:
    with DataLoader(on_files(folder, interleave=1), batch_size=5, collate_fn=list) as loader:
        got = [sample for batch in loader for sample in batch]
    assert [s["__key__"] for s in got] == [k for shard in range(SHARDS) for k in keys_of(shard)]
    first = got[0]
    assert first == {
        "__key__": "000000",
        "__shard__": "shard-00.tar",  # the location as given
        "txt": b"sample 000000",
        "cls": b"0",  # extensions lower-cased, as WebDataset
    }


@pytest.mark.parametrize("interleave", [1, 3, 4, 10])
def test_the_order_is_a_fixed_round_robin_whatever_num_workers(
    folder: Path, interleave: int
) -> None:
    expected = round_robin(list(range(SHARDS)), interleave)
    for workers, threads in ((0, 1), (1, 2), (4, 1), (4, 3)):
        with DataLoader(
            on_files(folder, interleave=interleave),
            batch_size=4,
            num_workers=workers,
            cpu_threads=threads,
            collate_fn=list,
        ) as loader:
            assert keys(loader) == expected


def test_shuffle_permutes_the_shards_by_seed_and_epoch(folder: Path) -> None:
    def epochs(seed: int) -> list[list[str]]:
        dataset = on_files(folder, interleave=2, shuffle=True)
        with DataLoader(dataset, batch_size=8, seed=seed, collate_fn=list) as loader:
            return [keys(loader) for _ in range(3)]

    first = epochs(5)
    everything = sorted(k for shard in range(SHARDS) for k in keys_of(shard))
    assert all(sorted(epoch) == everything for epoch in first)
    assert first[0] != first[1] != first[2]
    assert epochs(5) == first
    assert epochs(6) != first


def test_the_samplers_set_epoch_chooses_the_shard_streams_epoch(folder: Path) -> None:
    # Lightning's Trainer numbers a loader's epochs by set_epoch on its sampler, a stream's
    # too: it was taken and passed over, and a resumed run read its first epoch again.
    def make() -> DataLoader:
        shards = on_files(folder, shuffle=True, shuffle_buffer=5)
        return DataLoader(shards, batch_size=4, collate_fn=list, seed=3, num_workers=2)

    with make() as reference:
        epochs = [keys(reference) for _ in range(3)]
    assert epochs[1] != epochs[2]
    with make() as loader:
        sampler: Any = loader.sampler  # the loader's own
        sampler.set_epoch(2)  # before iter()
        assert keys(loader) == epochs[2]
        iterator = iter(loader)
        sampler.set_epoch(1)  # after it, before the first batch
        assert [sample["__key__"] for batch in iterator for sample in batch] == epochs[1]


def test_ranks_read_disjoint_shards_whose_union_is_the_epoch(folder: Path) -> None:
    shares = []
    for rank in range(3):
        dataset = on_files(folder, interleave=2, shuffle=True)
        with DataLoader(
            dataset, batch_size=4, rank=rank, world_size=3, seed=1, collate_fn=list
        ) as loader:
            shares.append(keys(loader))
    assert all(len(share) == 2 * PER_SHARD for share in shares)
    union = sorted(k for share in shares for k in share)
    assert union == sorted(k for shard in range(SHARDS) for k in keys_of(shard))


def rank_of_two(folder: Path, rank: int) -> DataLoader:
    """Rank ``rank`` of 2 over the shards, shuffled, interleaved and buffered."""
    shards = on_files(folder, interleave=2, shuffle=True, shuffle_buffer=5)
    return DataLoader(shards, batch_size=3, rank=rank, world_size=2, collate_fn=list)


def batch_keys(loader: DataLoader) -> list[list[str]]:
    return [[key(sample) for sample in batch] for batch in loader]


@pytest.mark.parametrize("taken", [0, 1, 3, 4])
def test_another_ranks_state_resumes_this_rank_from_its_own_share(folder: Path, taken: int) -> None:
    # Lightning saves rank 0's state alone and every rank loads it (its DDP checkpoints). The
    # state's TarShards part is of rank 0's shards, which rank 1 refused, so a Trainer could
    # not resume: ranks move in lockstep, and rank 1 reads its own share again up to the
    # same batch.
    whole = batch_keys(rank_of_two(folder, 1))
    saving = iter(saver := rank_of_two(folder, 0))
    for _ in range(taken):
        next(saving)
    state = saver.state_dict()
    resumed = rank_of_two(folder, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.load_state_dict(state)
    assert [str(warning.message) for warning in caught] == (
        [
            f"the state is rank 0's, and its TarShards state is of that rank's share: the "
            f"resumed epoch reads this rank's (1) first {taken} batches again and drops them"
        ]
        if taken
        else []
    )
    assert resumed.state_dict()["rank"] == 1
    assert batch_keys(resumed) == whole[taken:]


@pytest.mark.parametrize("then", ["between epochs", "another rank's"])
def test_a_state_loaded_after_another_replaces_it_whole(folder: Path, then: str) -> None:
    # A state without TarShards' own part (one between epochs, another rank's) left the walk
    # of a state loaded before it in TarShards: the epoch resumed from that walk (and then
    # dropped the batches of the new state's count too), not from the new state.
    whole = batch_keys(rank_of_two(folder, 1))
    own = iter(mine := rank_of_two(folder, 1))
    next(own)
    if then == "between epochs":
        later, rest = rank_of_two(folder, 1).state_dict(), whole
    else:
        other = iter(saver := rank_of_two(folder, 0))
        for _ in range(3):
            next(other)
        later, rest = saver.state_dict(), whole[3:]
    resumed = rank_of_two(folder, 1)
    resumed.load_state_dict(mine.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # another rank's: read again, and said
        resumed.load_state_dict(later)
    assert batch_keys(resumed) == rest


def test_fewer_shards_than_ranks_fails_the_epoch_saying_so(folder: Path) -> None:
    dataset = TarShards(FileDataset(names(2), root=folder))
    loader = DataLoader(dataset, batch_size=4, rank=0, world_size=3)
    with loader, pytest.raises(ValueError, match="2 shards for 3 ranks"):
        next(iter(loader))


def test_webdataset_reads_the_same_samples_with_the_same_keys(folder: Path) -> None:
    urls = [str(folder / name) for name in names()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves its files open
        theirs = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
        gc.collect()
    with DataLoader(on_files(folder, interleave=1), batch_size=6, collate_fn=list) as loader:
        ours = [sample for batch in loader for sample in batch]
    assert len(ours) == len(theirs) == SHARDS * PER_SHARD
    for mine, wds in zip(ours, theirs, strict=True):
        assert mine["__key__"] == wds["__key__"]
        assert {k: v for k, v in mine.items() if not k.startswith("__")} == {
            k: v for k, v in wds.items() if not k.startswith("__")
        }


def test_members_of_no_key_are_passed_over_as_webdataset_does(tmp_path: Path) -> None:
    # macOS tar writes a "._" file beside each file; a shard may hold a README. The shard
    # failed at the first of them, where webdataset reads every sample.
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        member(archive, "README", b"about these samples")
        for i in range(4):
            member(archive, f"._{i:03d}.jpg", b"\x00\x05\x16\x07")
            member(archive, f"{i:03d}.jpg", bytes([i]) * 10)
            member(archive, f"{i:03d}.cls", str(i).encode())
    (tmp_path / "mac.tar").write_bytes(out.getvalue())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves its files open
        theirs = list(webdataset.WebDataset([str(tmp_path / "mac.tar")], shardshuffle=False))
        gc.collect()
    dataset = TarShards(FileDataset(["mac.tar"], root=tmp_path))
    with DataLoader(dataset, batch_size=2, collate_fn=list) as loader:
        ours = [sample for batch in loader for sample in batch]
    assert (
        [s["__key__"] for s in ours]
        == [s["__key__"] for s in theirs]
        == ["000", "001", "002", "003"]
    )
    for mine, wds in zip(ours, theirs, strict=True):
        assert (mine["jpg"], mine["cls"]) == (wds["jpg"], wds["cls"])


def test_compressed_shards_are_read_too(tmp_path: Path) -> None:
    (tmp_path / "a.tar.gz").write_bytes(shard_bytes(0, compress=True))
    dataset = TarShards(FileDataset(["a.tar.gz"], root=tmp_path))
    with DataLoader(dataset, batch_size=3, collate_fn=list) as loader:
        assert keys(loader) == keys_of(0)


def test_a_compressed_shard_holds_its_buffer_and_one_step_not_its_whole_chunk(
    tmp_path: Path,
) -> None:
    # 2,000 samples of 32 KiB of zeros, 62.5 MiB: a gzip file of about 130 KiB, read in one
    # chunk. That chunk was inflated and parsed whole before its samples met the buffer.
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for i in range(2000):
            member(archive, f"{i:06d}.bin", bytes(2**15))
    (tmp_path / "bomb.tar.gz").write_bytes(out.getvalue())
    dataset = TarShards(FileDataset(["bomb.tar.gz"], root=tmp_path), buffer=8)
    with DataLoader(dataset, batch_size=4, collate_fn=list) as loader:
        tracemalloc.start()
        try:
            batches = iter(loader)
            first = next(batches)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert [sample["__key__"] for sample in first] == keys_of(0, 4)
        assert sum(len(batch) for batch in batches) == 1996
    assert peak < 8 * 2**20


def bad_shards(folder: Path) -> dict[str, bytes]:
    """A good shard between each bad one."""
    whole = shard_bytes(1)
    over = io.BytesIO()
    with tarfile.open(fileobj=over, mode="w") as archive:
        member(archive, "000001.txt", b"ok")
        member(archive, "000002.txt", b"x" * 5000)  # over max_bytes=4096
    twice = io.BytesIO()
    with tarfile.open(fileobj=twice, mode="w") as archive:
        member(archive, "000001.txt", b"ok")
        member(archive, "000001.txt", b"a second txt")
    return {
        "good-0.tar": shard_bytes(0),
        "cut.tar": whole[: len(whole) // 2],
        "good-2.tar": shard_bytes(2),
        "html.tar": b"<html>not a tar</html>" * 50,
        "good-3.tar": shard_bytes(3),
        "over.tar": over.getvalue(),
        "good-4.tar": shard_bytes(4),
        "twice.tar": twice.getvalue(),
    }


def test_a_broken_shard_fails_its_own_samples_and_the_epoch_goes_on(tmp_path: Path) -> None:
    files = bad_shards(tmp_path)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    dataset = TarShards(FileDataset(list(files), root=tmp_path), interleave=1, max_bytes=4096)
    with DataLoader(dataset, batch_size=None, num_workers=2, collate_fn=None) as loader:
        outcomes = every_outcome(loader, key, ShardError)
    good = [k for shard in (0, 2, 3, 4) for k in keys_of(shard)]
    assert [o for o in outcomes if not o.startswith("shard")] == [
        *keys_of(0),
        *keys_of(1)[: len([o for o in outcomes if o.startswith("01")])],
        *keys_of(2),
        *keys_of(3),
        "000001",
        *keys_of(4),
    ]
    errors = [o for o in outcomes if o.startswith("shard")]
    assert len(errors) == 4
    cut, html, over, second = errors
    assert "cut.tar" in cut
    assert "ends early" in cut or "end-of-archive" in cut
    assert "html.tar" in html
    assert "not a tar" in html
    assert "over.tar" in over
    assert "'000002.txt' is 5000 bytes, over max_bytes=4096" in over
    assert "twice.tar" in second
    assert "'000001.txt' is a second 'txt' in sample '000001'" in second
    assert set(good) <= set(outcomes)


def test_broken_shards_are_skipped_and_counted_under_errors_skip(tmp_path: Path) -> None:
    files = bad_shards(tmp_path)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    dataset = TarShards(FileDataset(list(files), root=tmp_path), max_bytes=4096)
    with DataLoader(dataset, batch_size=5, num_workers=2, errors="skip", collate_fn=list) as loader:
        got = keys(loader)
        assert loader.stats().skipped == 4
    assert set(got) >= {k for shard in (0, 2, 3, 4) for k in keys_of(shard)}


def test_a_shard_that_cannot_be_opened_fails_its_place(tmp_path: Path) -> None:
    (tmp_path / "a.tar").write_bytes(shard_bytes(0))
    os.mkfifo(tmp_path / "fifo.tar")
    dataset = TarShards(FileDataset(["fifo.tar", "missing.tar", "a.tar"], root=tmp_path))
    with DataLoader(dataset, batch_size=3, errors="skip", collate_fn=list) as loader:
        assert keys(loader) == keys_of(0)
        assert loader.stats().skipped == 2


def test_break_stops_every_shard_reader(folder: Path) -> None:
    def shard_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("asyncloader-shard")]

    dataset = on_files(folder, interleave=4, buffer=2)
    with DataLoader(dataset, batch_size=2, collate_fn=list) as loader:
        for _ in loader:
            assert shard_threads()
            break
    for thread in shard_threads():
        thread.join(10)
        assert not thread.is_alive()
    gc.collect()  # a file left open by a cancelled read would warn here (an error in tests)


@pytest.fixture
def http_shards(server: FaultServer) -> FaultServer:
    for shard in range(SHARDS):
        server.files[f"shard-{shard:02d}.tar"] = shard_bytes(shard)
    return server


def test_shards_stream_over_http_one_request_each(http_shards: FaultServer) -> None:
    urls = [f"{http_shards.url}/files/{name}" for name in names()]
    dataset = TarShards(HttpDataset(urls), interleave=3)
    with DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list) as loader:
        assert keys(loader) == round_robin(list(range(SHARDS)), 3)
    assert all(http_shards.hits[f"/files/{name}"] == 1 for name in names())


async def test_shards_stream_over_http_with_async_for(http_shards: FaultServer) -> None:
    urls = [f"{http_shards.url}/files/{name}" for name in names()]
    async with DataLoader(
        TarShards(HttpDataset(urls), interleave=2), batch_size=4, collate_fn=list
    ) as loader:
        got = [sample["__key__"] async for batch in loader for sample in batch]
    assert got == round_robin(list(range(SHARDS)), 2)


def test_stats_count_the_bytes_of_the_shards_read(folder: Path, http_shards: FaultServer) -> None:
    # Until session 32 a shard stream's statistics said 0 bytes: its items are samples (dicts),
    # not the bytes-like items that the count was taken from.
    whole = sum(len(shard_bytes(shard)) for shard in range(SHARDS))
    urls = [f"{http_shards.url}/files/{name}" for name in names()]
    for shards in (FileDataset(names(), root=folder), HttpDataset(urls)):
        with DataLoader(TarShards(shards, interleave=2), batch_size=4, collate_fn=list) as loader:
            assert len(keys(loader)) == SHARDS * PER_SHARD
            assert loader.stats().bytes == whole  # each shard's bytes once
            assert f"{whole / 2**20:.1f} MiB" in loader.stats().report()
            loader.reset_stats()
            samples = next(iter(loader))
        assert len(samples) == 4
        assert 0 < loader.stats().bytes <= whole


def test_a_cut_connection_and_a_missing_shard_fail_only_their_shards(
    http_shards: FaultServer,
) -> None:
    urls = [
        f"{http_shards.url}/files/shard-00.tar",
        f"{http_shards.url}/files-cut/shard-01.tar",
        f"{http_shards.url}/files/none.tar",
        f"{http_shards.url}/files/shard-02.tar",
    ]
    dataset = TarShards(HttpDataset(urls), interleave=1)
    with DataLoader(dataset, batch_size=None, collate_fn=None) as loader:
        outcomes = every_outcome(loader, key)
    samples = [o for o in outcomes if not o.startswith("shard")]
    errors = [o for o in outcomes if o.startswith("shard")]
    assert samples[:PER_SHARD] == keys_of(0)
    assert samples[-PER_SHARD:] == keys_of(2)
    assert len(errors) == 2
    assert "files-cut/shard-01.tar" in errors[0]
    assert "files/none.tar" in errors[1]
    assert "HTTP 404" in errors[1]
    # The cut is resumed with a range of the rest, which this server answers whole: bytes
    # that would come twice, so that shard fails there, not worth another attempt.
    assert "does not serve byte ranges" in errors[0]
    assert http_shards.hits["/files-cut/shard-01.tar"] == 2


def test_a_shard_cut_part_way_is_resumed_and_loses_no_sample(http_shards: FaultServer) -> None:
    # Before session 29 a shard's stream cut after its first byte was not tried again: the
    # rest of that shard was lost (here, of the 7 samples of shard 1, the ones after its
    # first half). Its stream is now resumed where it stopped, twice here.
    urls = [f"{http_shards.url}/files/{name}" for name in names()]
    urls[1] = f"{http_shards.url}/cut/2/shard-01.tar"
    retry = Retry(max_retries=2, initial_backoff=0.001, max_backoff=0.001)
    dataset = TarShards(HttpDataset(urls, retry=retry), interleave=3)
    with DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list) as loader:
        assert keys(loader) == round_robin(list(range(SHARDS)), 3)
        assert loader.stats().retries == 2
    assert http_shards.hits["/cut/2/shard-01.tar"] == 3


def test_a_shard_is_read_no_further_than_its_end_of_archive(http_shards: FaultServer) -> None:
    # A server that goes on sending after the tar's end: the shard ends at its end-of-archive
    # blocks, as tarfile's stream mode does, not when (if ever) the body does.
    url = f"{http_shards.url}/files-endless/shard-00.tar"
    got: list[Any] = []

    def read() -> None:
        with DataLoader(TarShards(HttpDataset([url])), batch_size=None) as loader:
            got.extend(every_outcome(loader, key))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), "the epoch did not end"
    assert got == keys_of(0)
    assert http_shards.sent["/files-endless/shard-00.tar"] < 64 << 20


def test_a_shard_that_fails_before_its_first_byte_is_retried(http_shards: FaultServer) -> None:
    urls = [f"{http_shards.url}/flaky-files/2/{name}" for name in names(2)]
    with DataLoader(TarShards(HttpDataset(urls)), batch_size=4, collate_fn=list) as loader:
        assert sorted(keys(loader)) == sorted(keys_of(0) + keys_of(1))
        assert loader.stats().retries == 4
    assert all(http_shards.hits[f"/flaky-files/2/{name}"] == 3 for name in names(2))


def test_a_shard_whose_server_stalls_fails_after_the_timeout(http_shards: FaultServer) -> None:
    # Half a shard at once, then 5 s of silence: each wait for data is bounded by timeout.
    url = f"{http_shards.url}/files-stall/shard-00.tar"
    dataset = TarShards(HttpDataset([url], timeout=0.3, retry=Retry(max_retries=0)))
    with DataLoader(dataset, batch_size=None, collate_fn=None) as loader:
        outcomes = every_outcome(loader, key)
    assert outcomes[:-1] == keys_of(0)[: len(outcomes) - 1]  # the half that came
    assert 0 < len(outcomes) - 1 < PER_SHARD
    assert "files-stall/shard-00.tar" in outcomes[-1]
    assert "0.3 s" in outcomes[-1]


def test_shards_stream_from_s3() -> None:
    objects = {f"train/{name}": shard_bytes(shard) for shard, name in enumerate(names())}
    with run_moto("shards", objects) as moto:
        store = ObjectStoreDataset(
            "s3://shards/train",
            names(),
            endpoint=moto.endpoint,
            allow_http=True,
            **CREDENTIALS,
        )
        dataset = TarShards(store, interleave=2, shuffle=True)
        with DataLoader(dataset, batch_size=4, num_workers=2, seed=3, collate_fn=list) as loader:
            got = keys(loader)
    everything = sorted(k for shard in range(SHARDS) for k in keys_of(shard))
    assert sorted(got) == everything
    assert got != round_robin(list(range(SHARDS)), 2)


def test_tar_shards_settings_are_checked(folder: Path) -> None:
    with pytest.raises(TypeError, match="shards must be"):
        TarShards([str(folder / "shard-00.tar")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interleave"):
        on_files(folder, interleave=0)
    with pytest.raises(ValueError, match="buffer"):
        on_files(folder, buffer=0)
    with pytest.raises(ValueError, match="max_bytes"):
        on_files(folder, max_bytes=-1)


def test_a_sample_error_from_any_stream_fails_only_its_batch() -> None:
    def stream() -> Iterator[Any]:
        yield from range(4)
        yield SampleError(KeyError("sample 4 is gone"))
        yield from range(5, 12)

    with DataLoader(stream(), batch_size=4) as loader:
        iterator = iter(loader)
        assert next(iterator).tolist() == [0, 1, 2, 3]
        with pytest.raises(KeyError, match="sample 4 is gone"):
            next(iterator)
        assert [b.tolist() for b in iterator] == [[8, 9, 10, 11]]


def test_iterating_tar_shards_outside_a_loader_reads_them_in_order(folder: Path) -> None:
    async def read() -> list[str]:
        return [sample["__key__"] async for sample in on_files(folder, interleave=1)]

    assert asyncio.run(read()) == [k for shard in range(SHARDS) for k in keys_of(shard)]


class Counted(FileDataset):
    """A FileDataset that counts the shards opened."""

    opened = 0

    async def stream(self, index: int, sink: Any, blocking: Any) -> None:
        type(self).opened += 1
        await super().stream(index, sink, blocking)


def mixed(folder: Path, **settings: Any) -> TarShards:
    return TarShards(
        Counted(names(), root=folder), interleave=2, shuffle=True, shuffle_buffer=9, **settings
    )


def test_the_shuffle_buffer_mixes_samples_the_same_way_whatever_num_workers(
    folder: Path,
) -> None:
    runs = []
    for workers in (0, 3):
        with DataLoader(
            mixed(folder), batch_size=5, num_workers=workers, seed=4, collate_fn=list
        ) as loader:
            runs.append([keys(loader), keys(loader)])
    assert runs[0] == runs[1]
    (first, second), _ = runs
    with DataLoader(
        TarShards(FileDataset(names(), root=folder), interleave=2, shuffle=True),
        batch_size=5,
        seed=4,
        collate_fn=list,
    ) as loader:
        unmixed = keys(loader)
    assert sorted(first) == sorted(unmixed)
    assert first != unmixed
    assert first != second


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_checkpoint_of_tar_shards_resumes_exactly(folder: Path, mode: str) -> None:
    def make() -> DataLoader:
        return DataLoader(
            mixed(folder),
            batch_size=4,
            num_workers=2,
            seed=11,
            collate_fn=lambda samples: [s["__key__"] for s in samples],
        )

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "reads again" warning: the walk is restored
        assert assert_equal_output_after_checkpoint(make, epochs=2, mode=mode) > 20


@pytest.mark.parametrize("errors", ["raise", "skip"])
def test_every_checkpoint_resumes_exactly_around_shards_that_fail(
    tmp_path: Path, errors: Literal["raise", "skip"]
) -> None:
    # One shard cut in the middle of its samples, one that is not a tar: each fails in its
    # place; a resume from before, at or after those places gives the same outcomes.
    for shard in range(5):
        data = shard_bytes(shard)
        if shard == 2:
            data = data[: len(data) // 2]
        elif shard == 3:
            data = b"not a tar " * 100
        (tmp_path / f"shard-{shard:02d}.tar").write_bytes(data)

    def make() -> DataLoader:
        shards = TarShards(
            FileDataset(names(5), root=tmp_path), interleave=2, shuffle=True, shuffle_buffer=5
        )
        return DataLoader(
            shards, batch_size=3, num_workers=2, seed=7, errors=errors, collate_fn=list
        )

    assert assert_equal_output_after_checkpoint(make, epochs=2) > 20


def test_resume_reads_only_the_open_shards_and_the_buffers(folder: Path) -> None:
    with DataLoader(mixed(folder), batch_size=4, seed=2, collate_fn=list) as loader:
        iterator: Any = iter(loader)
        for _ in range(6):
            next(iterator)
        state = loader.state_dict()
        iterator.close()
    walk = state["source"]
    assert len(walk["slots"]) == 2
    assert len(walk["buffered"]) == 9
    Counted.opened = 0
    restored = DataLoader(mixed(folder), batch_size=4, seed=2, collate_fn=list)
    with restored:
        restored.load_state_dict(state)
        next(iter(restored))
    buffered_shards = {p for p, _ in walk["buffered"]}
    assert Counted.opened <= 2 + len(buffered_shards)


class Open(FileDataset):
    """A FileDataset that counts the shards open at once, at most."""

    now = peak = 0

    async def stream(self, index: int, sink: Any, blocking: Any) -> None:
        kind = type(self)
        kind.now += 1
        kind.peak = max(kind.peak, kind.now)
        try:
            await super().stream(index, sink, blocking)
        finally:
            kind.now -= 1


def test_a_resume_refills_its_buffer_from_a_few_shards_at_a_time(tmp_path: Path) -> None:
    # A buffer of samples from 250 one-sample shards: the refill opened all 250 at once
    # (each reading `buffer` samples ahead), where reading them holds 2 open and 2 ahead.
    count = 300
    for shard in range(count):
        (tmp_path / f"{shard}.tar").write_bytes(shard_bytes(shard, count=1))

    def one_sample_shards() -> TarShards:
        files = Open([f"{shard}.tar" for shard in range(count)], root=tmp_path)
        return TarShards(files, interleave=2, shuffle_buffer=250)

    with DataLoader(one_sample_shards(), batch_size=10, seed=3, collate_fn=list) as loader:
        uncut = [key(s) for batch in loader for s in batch]
    with DataLoader(one_sample_shards(), batch_size=10, seed=3, collate_fn=list) as loader:
        iterator: Any = iter(loader)
        next(iterator)
        state = loader.state_dict()
        iterator.close()
    assert len(state["source"]["buffered"]) == 250
    assert Open.peak <= 4
    Open.peak = 0
    with DataLoader(one_sample_shards(), batch_size=10, seed=3, collate_fn=list) as restored:
        restored.load_state_dict(state)
        resumed = [key(s) for batch in restored for s in batch]
    assert Open.peak <= 6  # the 2 open, the 2 ahead, and 2 refilling
    assert resumed == uncut[10:]


def state_after_a_batch(folder: Path) -> dict[str, Any]:
    """The state of a loader over ``mixed(folder)`` (seed 2) after its first batch."""
    with DataLoader(mixed(folder), batch_size=4, seed=2, collate_fn=list) as loader:
        iterator: Any = iter(loader)
        next(iterator)
        state = loader.state_dict()
        iterator.close()
    return state


def test_a_hostile_tar_shards_state_is_refused_naming_the_field(folder: Path) -> None:
    state = state_after_a_batch(folder)
    walk = state["source"]
    changes: list[tuple[dict[str, Any], str]] = [
        ({"format": 2}, "format"),
        ({"opened": 99}, "opened"),
        ({"slots": [[0, 1], [0, 2]]}, "slots"),
        ({"slots": [[0, 1], [1, 1], [2, 0]]}, "slots"),
        ({"turn": 5}, "turn"),
        ({"buffered": [[0, 0]] * 2}, "buffered"),
        ({"buffered": [[walk["slots"][0][0], 10**6]]}, "not yet taken"),
        ({"buffered": [[0, 0]] * 10}, "shuffle_buffer"),
        ({"draws": -1}, "draws"),
        ({"rank": 1}, "rank"),
        ({"slots": "nope"}, "slots"),
    ]
    for change, match in changes:
        restored = DataLoader(mixed(folder), batch_size=4, seed=2, collate_fn=list)
        with pytest.raises(ValueError, match=match):
            restored.load_state_dict({**state, "source": {**walk, **change}})
        assert restored.state_dict()["batches_received"] == 0  # left as it was


@pytest.mark.parametrize("saved_shuffled", [False, True])
def test_a_state_saved_with_another_shuffle_is_refused(folder: Path, saved_shuffled: bool) -> None:
    # The walk's places are in the order of its shards, which `shuffle` decides: loaded under
    # the other setting, a state of 6 shards of 10 samples gave 16 of them twice, 16 never.
    def loader(shuffle: bool) -> DataLoader:
        dataset = on_files(folder, interleave=2, shuffle=shuffle)
        return DataLoader(dataset, batch_size=4, seed=2, collate_fn=list)

    with loader(saved_shuffled) as saved:
        iterator: Any = iter(saved)
        next(iterator)
        state = saved.state_dict()
        iterator.close()
    restored = loader(not saved_shuffled)
    with restored, pytest.raises(ValueError, match=f"saved with shuffle={saved_shuffled}"):
        restored.load_state_dict(state)
    assert restored.state_dict()["batches_received"] == 0  # left as it was
    dataset = on_files(folder, interleave=2, shuffle=not saved_shuffled)
    with pytest.raises(ValueError, match=f"saved with shuffle={saved_shuffled}"):
        dataset.load_elastic([state["source"]], 0, 1)


def test_ranks_without_a_seed_still_share_one_order(folder: Path) -> None:
    # Each rank is its own process: a seed drawn from each one's OS would give each rank
    # another permutation of the shards, and the shares would overlap.
    shares = []
    for rank in range(2):
        dataset = on_files(folder, interleave=2, shuffle=True)
        with DataLoader(dataset, batch_size=4, rank=rank, world_size=2, collate_fn=list) as loader:
            shares.append(keys(loader))
    assert not set(shares[0]) & set(shares[1])
    assert len(shares[0]) + len(shares[1]) == SHARDS * PER_SHARD


def two_rank_states(folder: Path, batches: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The states two ranks saved after ``batches`` batches each, and what they received."""

    def make(rank: int, world_size: int) -> DataLoader:
        return DataLoader(
            mixed(folder), batch_size=4, rank=rank, world_size=world_size, seed=8, collate_fn=list
        )

    return rank_states(make, 2, batches, key)


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("batches", [0, 3, 6])  # before the first batch; inside; after the last
def test_a_state_of_two_ranks_resumes_over_another_number_of_ranks(
    folder: Path, world_size: int, batches: int
) -> None:
    # Each rank reads 21 samples, 6 batches of 4: after the sixth its state is the next
    # epoch's start, which holds no position in a stream. States at an epoch's edge were
    # refused ("a rank's state holds no state of the stream"), so a job checkpointed at an
    # epoch's end could not resume on another number of ranks.
    states, before = two_rank_states(folder, batches=batches)
    epoch = 1 if batches == 6 else 0
    assert {state["epoch"] for state in states} == {epoch}
    after: list[str] = []
    for rank in range(world_size):
        restored = DataLoader(
            mixed(folder), batch_size=4, rank=rank, world_size=world_size, seed=8, collate_fn=list
        )
        with restored:
            restored.load_state_dict(states)
            assert restored.epoch == restored.state_dict()["epoch"] == epoch
            after += keys(restored)
            assert restored.state_dict()["epoch"] == epoch + 1
    everything = sorted(k for shard in range(SHARDS) for k in keys_of(shard))
    if epoch == 1:  # the first epoch was read whole: the new ranks read the next one whole
        assert sorted(before) == everything
        before = []
    assert len(before) + len(after) == len(everything)  # nothing twice
    assert sorted(before + after) == everything  # nothing left out


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=7),
    interleave=st.integers(1, 4),
    shuffle=st.booleans(),
    shuffle_buffer=st.sampled_from([0, 1, 3, 6]),
    batch_size=st.integers(1, 5),
    saved=st.integers(1, 3),
    new=st.integers(1, 4),
    taken=st.integers(0, 4),
)
def test_an_elastic_resume_never_loses_or_repeats_a_sample(
    sizes: list[int],
    interleave: int,
    shuffle: bool,
    shuffle_buffer: int,
    batch_size: int,
    saved: int,
    new: int,
    taken: int,
) -> None:
    # Shards of uneven sizes (empty ones too), any mixing, saved by `saved` ranks after
    # `taken` batches each and loaded into `new` ranks: what the first ranks received and
    # what the new ones read is the epoch, each sample once (or, where every first rank had
    # read its whole epoch, the new ones read the next epoch whole); the rest of an epoch
    # goes on over more ranks than shards, a new epoch does not. Ranks whose epochs ended
    # apart (uneven shares) were refused ("differ in epoch").
    saved = min(saved, len(sizes))  # every first rank reads a shard
    everything = sorted(f"{s:02d}{i:04d}" for s, count in enumerate(sizes) for i in range(count))
    with tempfile.TemporaryDirectory() as where:
        folder = Path(where)
        write_shards(folder, sizes)

        def loader(rank: int, world_size: int) -> DataLoader:
            return DataLoader(
                TarShards(
                    FileDataset(names(len(sizes)), root=folder),
                    interleave=interleave,
                    shuffle=shuffle,
                    shuffle_buffer=shuffle_buffer,
                ),
                batch_size=batch_size,
                rank=rank,
                world_size=world_size,
                seed=5,
                collate_fn=list,
            )

        states, before = rank_states(loader, saved, taken, key)
        # A rank whose share ran out names the next epoch: the others' epoch goes on.
        inside = min(states, key=lambda state: state["epoch"])
        if inside["epoch"] == 1:
            assert sorted(before) == everything
            before = []
        after: list[str] = []
        for rank in range(new):
            with loader(rank, new) as restored:
                restored.load_state_dict(states)
                if inside["batches_received"] == 0 and len(sizes) < new:
                    with pytest.raises(ValueError, match=f"{len(sizes)} shards for {new} ranks"):
                        keys(restored)
                    return
                after += keys(restored)
    assert sorted(before + after) == everything


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 8), min_size=2, max_size=5),
    interleave=st.integers(1, 3),
    shuffle=st.booleans(),
    shuffle_buffer=st.sampled_from([0, 1, 7]),
    batch_size=st.integers(1, 5),
    drop_last=st.booleans(),
    num_workers=st.sampled_from([0, 3]),
    world_size=st.integers(1, 2),
    short=st.booleans(),
    mode=st.sampled_from(["sync", "async"]),
)
def test_any_shard_layout_resumes_exactly_from_every_state(
    sizes: list[int],
    interleave: int,
    shuffle: bool,
    shuffle_buffer: int,
    batch_size: int,
    drop_last: bool,
    num_workers: int,
    world_size: int,
    short: bool,
    mode: str,
) -> None:
    # Uneven and empty shards, rank 0 of one or two, and a length= below what the rank
    # reads (`short`): every state the loader saves over two epochs resumes exactly.
    with tempfile.TemporaryDirectory() as where:
        folder = Path(where)
        write_shards(folder, sizes)

        def make() -> DataLoader:
            shards = TarShards(
                FileDataset(names(len(sizes)), root=folder),
                interleave=interleave,
                shuffle=shuffle,
                shuffle_buffer=shuffle_buffer,
                length=sum(sizes) // 4 if short else None,
            )
            return DataLoader(
                shards,
                batch_size=batch_size,
                drop_last=drop_last,
                num_workers=num_workers,
                rank=0,
                world_size=world_size,
                seed=3,
                collate_fn=lambda samples: [sample["__key__"] for sample in samples],
            )

        assert assert_equal_output_after_checkpoint(make, epochs=2, mode=mode) >= 3


def test_the_rest_of_an_epoch_goes_on_over_more_ranks_than_shards(tmp_path: Path) -> None:
    # Two shards, two ranks, a batch each, then three ranks: the rest is two pieces of
    # shards, one for each of two new ranks and none for the third. Each new rank's epoch
    # failed at its first batch ("2 shards for 3 ranks"): the fresh split of the shards was
    # made even where the loaded plan named the pieces to read.
    write_shards(tmp_path, [3, 3])

    def loader(rank: int, world_size: int) -> DataLoader:
        shards = TarShards(FileDataset(names(2), root=tmp_path), interleave=2)
        return DataLoader(
            shards, batch_size=1, rank=rank, world_size=world_size, seed=6, collate_fn=list
        )

    states, before = rank_states(loader, 2, 1, key)
    after: list[list[str]] = []
    for rank in range(3):
        with loader(rank, 3) as restored:
            restored.load_state_dict(states)
            after.append(keys(restored))
            with pytest.raises(ValueError, match="2 shards for 3 ranks"):
                list(restored)  # the next epoch is split afresh: too few shards
    assert sorted(before) == ["000000", "010000"]
    assert sorted(after) == [[], ["000001", "000002"], ["010001", "010002"]]


@pytest.mark.parametrize("world_size", [1, 3])
def test_ranks_whose_epochs_ended_apart_resume_over_another_number_of_ranks(
    tmp_path: Path, world_size: int
) -> None:
    # Rank 0 reads shards 0 and 2 (9 samples), rank 1 shard 1 (2): after 2 batches of 2 each,
    # rank 1's epoch is over and its state names the next epoch's start, rank 0's is inside
    # the first. Such states were refused ("differ in epoch"), so a job whose ranks' shares
    # are uneven (or one whose rank found its end before another did, at an epoch's last
    # batch) could not change its number of ranks near an epoch's end.
    write_shards(tmp_path, [4, 2, 5])

    def loader(rank: int, world_size: int) -> DataLoader:
        shards = TarShards(FileDataset(names(3), root=tmp_path), interleave=1, shuffle_buffer=3)
        return DataLoader(
            shards, batch_size=2, rank=rank, world_size=world_size, seed=4, collate_fn=list
        )

    states, before = rank_states(loader, 2, 2, key)
    assert [(state["epoch"], state["batches_received"]) for state in states] == [(0, 2), (1, 0)]
    after: list[str] = []
    for rank in range(world_size):
        with loader(rank, world_size) as restored:
            restored.load_state_dict(states)
            assert restored.epoch == 0
            after += keys(restored)
            assert restored.state_dict()["epoch"] == 1
    everything = keys_of(0, 4) + keys_of(1, 2) + keys_of(2, 5)
    assert len(before) + len(after) == len(everything)  # nothing twice
    assert sorted(before + after) == everything  # nothing left out


def test_a_rank_in_the_next_epoch_is_refused_beside_one_inside_an_epoch(folder: Path) -> None:
    # A rank whose epoch was over names the next epoch's start; one that had gone further
    # into the next epoch, or two epochs on, is not of the same moment as the others.
    states, _ = two_rank_states(folder, batches=1)
    done = {**states[1], "epoch": 1, "batches_received": 0, "source": None}
    loader = DataLoader(mixed(folder), batch_size=4, seed=8, collate_fn=list)
    for bad, match in [
        ([states[0], {**done, "batches_received": 1}], "differ in epoch"),
        ([states[0], {**done, "epoch": 2}], "differ in epoch"),
        ([states[0], done, done], "one state of each of 2 ranks"),
    ]:
        with pytest.raises(ValueError, match=match):
            loader.load_state_dict(bad)
    assert loader.state_dict()["batches_received"] == 0
    walk = states[0]["source"]
    for walks, match in [
        ([{}, {}], "a rank inside the epoch"),
        ([walk, walk], "one state of each rank"),
        ([walk, {}, {}], "one state of each rank"),
    ]:
        with pytest.raises(ValueError, match=match):
            mixed(folder).load_elastic(walks, 0, 1)
    loader.load_state_dict([states[0], done])
    assert loader.epoch == 0


def test_a_hostile_elastic_plan_is_refused_naming_it(folder: Path) -> None:
    states, _ = two_rank_states(folder, batches=1)
    loader = DataLoader(mixed(folder), batch_size=4, rank=0, world_size=3, seed=8)
    loader.load_state_dict(states)
    walk = loader.state_dict()["source"]
    assert len(walk["plan"]) == walk["shards"]
    for plan, match in [
        ([[99, 0, None]] * walk["shards"], "plan"),  # no such shard
        ([[0, 0, [3, 1]]] * walk["shards"], "plan"),  # unsorted places
        ([[0, 2, [1]]] * walk["shards"], "plan"),  # a skip with kept places
        ([[0, 0, None]] * (walk["shards"] + 1), "units"),
        ("all", "plan"),
    ]:
        fresh = DataLoader(mixed(folder), batch_size=4, rank=0, world_size=3, seed=8)
        state = {**loader.state_dict(), "source": {**walk, "plan": plan}}
        with pytest.raises(ValueError, match=match):
            fresh.load_state_dict(state)


def test_checkpoints_within_an_elastic_epoch_resume_exactly(folder: Path) -> None:
    states, _ = two_rank_states(folder, batches=2)

    def make() -> DataLoader:
        loader = DataLoader(
            mixed(folder),
            batch_size=4,
            rank=1,
            world_size=3,
            seed=8,
            collate_fn=lambda samples: [s["__key__"] for s in samples],
        )
        loader.load_state_dict(states)
        return loader

    assert assert_equal_output_after_checkpoint(make, epochs=1) > 3


def test_an_elastic_resume_needs_every_rank_of_one_epoch(folder: Path) -> None:
    states, _ = two_rank_states(folder, batches=1)
    loader = DataLoader(mixed(folder), batch_size=4, seed=8, collate_fn=list)
    for bad, match in [
        ([states[0]], "one state of each of 2 ranks"),
        ([states[0], states[0]], "one state of each"),
        ([states[0], {**states[1], "epoch": 3}], "differ in epoch"),
        ([], "got none"),
        ([{**s, "source": {**s["source"], "epoch": 3}} for s in states], "epoch"),
        ([{**s, "source": {**s["source"], "seed": 5}} for s in states], "seed"),
    ]:
        with pytest.raises(ValueError, match=match):
            loader.load_state_dict(bad)
    assert loader.state_dict()["batches_received"] == 0
    plain = DataLoader(Numbers(10), batch_size=4, seed=8)
    stream_states = [{**plain.state_dict(), "rank": r, "world_size": 2} for r in range(2)]
    inside = [{**state, "batches_received": 1} for state in stream_states]
    with pytest.raises(ValueError, match="cannot re-split"):
        plain.load_state_dict(inside)
    plain.load_state_dict(stream_states)  # at the epoch's start: nothing to re-split
    assert len([sample for batch in plain for sample in batch]) == 10


def test_a_walk_of_another_epoch_seed_or_rank_is_refused_when_loaded(folder: Path) -> None:
    # The walk names the epoch, seed and rank it was saved in, as the loader's state does: a
    # state whose two disagree is refused by load_state_dict, not at the next batch (seed,
    # rank) or never (epoch: the walk was dropped and the epoch read again from its start).
    state = state_after_a_batch(folder)
    walk = state["source"]
    for change, match in [
        ({"epoch": 3}, "epoch"),
        ({"seed": 5}, "seed"),
        ({"rank": 1, "world_size": 2}, "rank"),
    ]:
        restored = DataLoader(mixed(folder), batch_size=4, seed=2, collate_fn=list)
        with pytest.raises(ValueError, match=match):
            restored.load_state_dict({**state, "source": {**walk, **change}})
        assert restored.state_dict()["batches_received"] == 0  # left as it was
        assert len(keys(restored)) == SHARDS * PER_SHARD
    restored = DataLoader(mixed(folder), batch_size=4, seed=2, collate_fn=list)
    with pytest.raises(ValueError, match="epoch"):
        restored.load_state_dict({**state, "epoch": 1})
    not_walks: list[object] = [0, False, [], ""]  # not "no walk" ({}): a fresh epoch's
    for source in not_walks:
        with pytest.raises(ValueError, match="source"):
            restored.load_state_dict({**state, "source": source})
