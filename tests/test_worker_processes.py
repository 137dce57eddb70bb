"""``cpu_processes``: the CPU stage in worker processes, with the guarantees of threads.

Real worker processes everywhere; what could hang or kill the test runs in a child process
with a hard time-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import mmap
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncloader import (
    DataLoader,
    ImageCollator,
    SkipBudgetExceeded,
    WorkerError,
    _logs,
    _processes,
)
from asyncloader.testing import assert_equal_output_after_checkpoint

from . import proc_data
from .cgroups import v1_group
from .children import INTERRUPTIBLE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ready(loader: DataLoader) -> DataLoader:
    """``loader`` once its workers are ready (until then, its CPU threads serve)."""
    procs = loader._runtime_here().procs
    assert procs is not None
    assert procs.wait_ready(30.0)
    return loader


def run_epoch(loader: DataLoader) -> list[Any]:
    """Each batch of one epoch, or the exception raised in its place."""
    return list(proc_data.outcomes(loader))


def _batches(loader: DataLoader, epochs: int = 2) -> list[list[Any]]:
    out = []
    for _ in range(epochs):
        out.append([np.array(batch) for batch in loader])
    return out


def _same(a: list[list[Any]], b: list[list[Any]]) -> None:
    assert [len(epoch) for epoch in a] == [len(epoch) for epoch in b]
    for epoch_a, epoch_b in zip(a, b, strict=True):
        for x, y in zip(epoch_a, epoch_b, strict=True):
            assert x.dtype == y.dtype
            assert x.shape == y.shape
            assert np.array_equal(x, y)


@pytest.mark.parametrize(
    "dataset",
    [
        lambda: proc_data.Images(40),
        lambda: proc_data.AsyncImages(40),
        lambda: proc_data.StreamOfImages(40),
    ],
    ids=["sync", "async", "stream"],
)
def test_batches_are_bit_identical_to_threads_with_random_augmentation(dataset: Any) -> None:
    shuffled = {} if isinstance(dataset(), proc_data.StreamOfImages) else {"shuffle": True}
    common: dict[str, Any] = {
        "batch_size": 6,
        "seed": 3,
        "transform": proc_data.augment(),
        "collate_fn": ImageCollator(),
        **shuffled,
    }
    with DataLoader(dataset(), cpu_threads=2, num_workers=2, **common) as threads:
        expected = _batches(threads)
    with ready(DataLoader(dataset(), cpu_processes=2, **common)) as processes:
        got = _batches(processes)
    _same(got, expected)
    with DataLoader(dataset(), cpu_processes=2, **common) as starting:  # threads, then workers
        _same(_batches(starting), expected)
    assert not np.array_equal(expected[0][0], expected[1][0])  # the epochs differ


async def test_async_for_with_lanes_gives_the_same_batches() -> None:
    common: dict[str, Any] = {"batch_size": 5, "seed": 1, "transform": proc_data.augment()}
    with DataLoader(proc_data.AsyncImages(23), item_concurrency=4, **common) as threads:
        expected = [np.array(batch) async for batch in threads]
    async with DataLoader(
        proc_data.AsyncImages(23), item_concurrency=4, cpu_processes=2, **common
    ) as processes:
        got = [np.array(batch) async for batch in processes]
    _same([got], [expected])


def _pids(loader: DataLoader) -> tuple[set[int], set[int]]:
    """The processes that fetched one epoch's items, and their parents."""
    batches = list(loader)
    indices, pids, parents = (np.concatenate([b[k] for b in batches]) for k in range(3))
    assert indices.tolist() == list(range(8))
    return set(pids.tolist()), set(parents.tolist())


def test_the_threads_serve_until_a_worker_forked_by_the_server_is_ready() -> None:
    with DataLoader(proc_data.Where(), batch_size=4, cpu_processes=2) as loader:
        # The first epoch starts with the workers: its first batch does not wait for them.
        assert next(iter(loader))[1].tolist() == [os.getpid()] * 4
        procs = loader._runtime.procs if loader._runtime is not None else None
        assert procs is not None
        assert procs.wait_ready(30.0)
        pids, parents = _pids(loader)
    assert os.getpid() not in pids
    # forkserver: the workers are children of the fork server, not of this process, which
    # runs threads (never forked).
    assert os.getpid() not in parents


def test_workers_are_not_forked_from_a_zygote_that_an_import_gave_a_thread() -> None:
    from . import proc_threaded

    with ready(DataLoader(proc_threaded.Threads(), batch_size=3, cpu_processes=1)) as loader:
        batches = list(loader)
    assert [b[0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    # A worker forked from that zygote would run one thread (a fork keeps only the caller's);
    # this one is a fresh interpreter, which imported the module and so has its thread too.
    assert all(count >= 2 for batch in batches for count in batch[1].tolist())


def test_until_a_worker_is_ready_one_thread_runs_the_users_code() -> None:
    with DataLoader(
        proc_data.Images(64), batch_size=8, cpu_processes=2, transform=proc_data.overlapping
    ) as loader:
        assert len(next(iter(loader))) == 8  # made here, before any worker started
        assert len(list(loader)) == 8
    # Code written for processes may not be safe in two threads at once: it never ran so.
    assert proc_data.most_at_once() == 1


def test_batches_that_waited_for_the_workers_to_start_then_go_to_them_at_once(
    tmp_path: Any,
) -> None:
    # Batch 0 is made here until the workers are ready; batches 1 and 2 wait behind it for
    # that, and then both go to the worker: batch 1 is made only once batch 2 is there too.
    data = proc_data.Gated(3, str(tmp_path), gated=(0, 1))
    with DataLoader(data, batch_size=1, num_workers=3, cpu_processes=1) as loader:
        procs = loader._runtime_here().procs
        assert procs is not None
        seen: list[int] = []

        def open_gates() -> None:
            assert procs.wait_ready(30.0)
            (tmp_path / "0").touch()
            for _ in range(1000):  # until batches 1 and 2 are both sent, or 10 s
                seen.append(procs._busy)
                if procs._busy >= 2:
                    break
                threading.Event().wait(0.01)
            (tmp_path / "1").touch()

        opener = threading.Thread(target=open_gates)
        opener.start()
        try:
            batches = list(loader)
        finally:
            opener.join(40.0)
    assert [int(batch[0, 0, 0, 0]) for batch in batches] == [
        int(data[i][0, 0, 0]) for i in range(3)
    ]
    assert seen[-1] >= 2, f"batch 2 waited for batch 1's job: jobs in the workers {seen[-5:]}"


def test_the_dataset_is_pickled_once_whatever_the_epochs() -> None:
    proc_data.CountsPickles.pickled = 0
    with DataLoader(proc_data.CountsPickles(12), batch_size=4, cpu_processes=2) as loader:
        for _ in range(3):
            assert len(list(loader)) == 3
    assert proc_data.CountsPickles.pickled == 1


def _work_memory(pid: int | str) -> list[int]:
    """The pickled work's memories ``pid`` holds, by inode: a descriptor or a mapping each."""
    inodes = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # one closed while listed
            if "asyncloader-work" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                inodes.append(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    with open(f"/proc/{pid}/maps") as maps:
        inodes += [int(line.split()[4]) for line in maps if "asyncloader-work" in line]
    return inodes


def _all_loaded(loader: DataLoader) -> list[int]:
    """The pids of ``loader``'s workers once every one has loaded the work."""
    procs = loader._runtime_here().procs
    assert procs is not None
    deadline = time.monotonic() + 30
    # The epoch may have ended on the CPU threads before the pool even listed its workers.
    while len(procs.workers) < procs.processes or not all(w.ready for w in procs.workers):
        assert time.monotonic() < deadline, "the workers did not load the work"
        time.sleep(0.01)
    return [pid for pid in proc_data.worker_pids(loader) if pid is not None]


def test_the_work_is_one_sealed_memory_that_workers_unmap_once_loaded() -> None:
    loader = DataLoader(proc_data.Images(64), batch_size=4, cpu_processes=2)
    with loader:
        assert len(list(loader)) == 16
        pids = _all_loaded(loader)
        assert len(pids) == 2
        assert [_work_memory(pid) for pid in pids] == [[], []]
        work = loader._runtime_here().work
        assert work is not None
        fd = work.descriptor()
        try:
            inode = os.fstat(fd).st_ino
            with pytest.raises(PermissionError):  # sealed: no worker can spoil it
                os.pwrite(fd, b"x", 0)
        finally:
            os.close(fd)
        # The loader's one, for any worker that replaces a dead one.
        assert _work_memory("self").count(inode) == 1
    del loader, work
    gc.collect()
    assert inode not in _work_memory("self")


def _rows(loader: DataLoader) -> np.ndarray[Any, Any]:
    return np.concatenate([np.asarray(batch) for batch in loader])


def test_a_large_array_in_the_dataset_is_shared_by_the_workers_not_loaded_by_each() -> None:
    dataset = proc_data.HoldsArray(1024)
    with ready(DataLoader(dataset, batch_size=64, cpu_processes=2)) as loader:
        rows = _rows(loader)
    assert (rows[:, :4] == dataset.table[:, :4]).all()
    in_workers = rows[rows[:, 6] != os.getpid()]
    assert len(in_workers) == len(rows)
    assert in_workers[:, 4].all()  # each worker still maps the work: its array is a view on it
    assert in_workers[:, 5].all()  # and writable, copy-on-write


def _token_file(tmp_path: Any, npy: bool = False) -> str:
    """4 MiB of ``uint16`` in 4,096 rows of 512, row ``r`` starting at ``r``."""
    table = (np.arange(4096 * 512) // 512 + np.arange(4096 * 512) % 512).astype(np.uint16)
    path = str(tmp_path / ("tokens.npy" if npy else "tokens.bin"))
    if npy:
        np.save(path, table.reshape(4096, 512))
    else:
        table.tofile(path)
    return path


def _rows_and_work(dataset: Any, batch_size: int) -> tuple[np.ndarray[Any, Any], int]:
    """The rows of an epoch of ``dataset`` from 2 worker processes, once ready, and the size
    of the work's memory (what was pickled for them)."""
    with ready(DataLoader(dataset, batch_size=batch_size, cpu_processes=2)) as loader:
        procs = loader._runtime_here().procs
        assert procs is not None
        return _rows(loader), procs.work.layout[2]


@pytest.mark.parametrize("view", ["whole", "strided", "blocks", "npy"])
def test_an_array_that_maps_a_file_is_mapped_by_the_workers_not_copied(
    tmp_path: Any, view: str
) -> None:
    # np.memmap and np.load(mmap_mode="r") (a token file, a feature matrix: gigabytes) were
    # pickled as a copy of every byte when the loader was built: by hand, 1 GiB took 3.9 s,
    # 1 GiB of shared memory and 2 GiB of the loader's RSS, where torch's forked workers map it.
    path = _token_file(tmp_path, npy=view == "npy")
    dataset = proc_data.MapsFile(path, view=view)
    with DataLoader(dataset, batch_size=64, cpu_threads=1) as loader:
        expected = _rows(loader)
    rows, pickled = _rows_and_work(dataset, 64)
    assert (rows[:, :4] == expected[:, :4]).all()
    assert len(rows) == (2048 if view == "strided" else 4096)
    assert (rows[:, 5] != os.getpid()).all()  # all made in the workers
    # Each maps the file, once: 64 views of it were 64 mappings, each holding a descriptor.
    assert (rows[:, 4] == 1).all()
    # Loaded once, by their server, which forked them (its mapping's descriptor is no
    # descriptor that loading opened, which each worker would have to open for itself).
    assert len(set(rows[:, 6])) == 1
    assert rows[0, 6] not in rows[:, 5]
    assert pickled < 64 << 10  # the work without the file's 4 MiB


def test_an_arrow_table_that_maps_a_file_is_mapped_by_the_workers_not_copied(
    tmp_path: Any,
) -> None:
    # Its buffers were copied whole into the work's memory as the loader was built.
    import pyarrow
    import pyarrow.feather

    path = str(tmp_path / "table.arrow")
    table = pyarrow.table({"x": np.arange(1 << 16) * 3, "s": [str(i) for i in range(1 << 16)]})
    pyarrow.feather.write_feather(table, path, compression="uncompressed")
    rows, pickled = _rows_and_work(proc_data.MapsArrow(path), 4096)
    assert (rows[:, 0] == np.arange(1 << 16) * 3).all()
    assert rows[:, 1].all()  # each worker maps the file
    assert (rows[:, 2] != os.getpid()).all()
    assert pickled < 64 << 10  # not the file's 1.3 MiB


@pytest.mark.parametrize("written", [True, False])
def test_a_private_mapping_that_was_written_to_is_sent_as_its_bytes(
    tmp_path: Any, written: bool
) -> None:
    # mode="c": the dataset's writes stay in its own private copy, which the workers get;
    # not written to, it still holds the file's bytes, and goes as the file.
    path = _token_file(tmp_path)
    dataset = proc_data.MapsFile(path, mode="c")
    if written:
        dataset.table[1000, 0] = 7
    with ready(DataLoader(dataset, batch_size=64, cpu_processes=2)) as loader:
        rows = _rows(loader)
        procs = loader._runtime_here().procs
        assert procs is not None
        assert (procs.work.layout[2] > 4 << 20) is written
    assert rows[1000, 0] == (7 if written else 1000)
    assert (rows[:, 4] == (not written)).all()


def test_a_worker_writes_to_a_mapped_file_in_its_own_copy(tmp_path: Any) -> None:
    path = _token_file(tmp_path)
    before = pathlib.Path(path).read_bytes()
    dataset = proc_data.MapsFile(path, mode="r+", writes=True)
    with ready(DataLoader(dataset, batch_size=64, cpu_processes=2)) as loader:
        rows = _rows(loader)
    assert (rows[:, 0] == np.arange(4096) + 1).all()
    assert rows[:, 4].all()
    assert pathlib.Path(path).read_bytes() == before


@pytest.mark.parametrize("replacement", ["file", "fifo", "none"])
def test_a_mapped_file_replaced_before_the_workers_start_is_still_the_one_they_map(
    tmp_path: Any, replacement: str
) -> None:
    # Its path names another file (or a FIFO, whose open would block for ever), or none, by
    # the time the workers map it: found again by path, it would give other data or fail.
    # The loader holds the file open from its construction, and the workers map it from
    # that descriptor.
    path = _token_file(tmp_path)
    dataset = proc_data.MapsFile(path)
    with DataLoader(dataset, batch_size=512, cpu_threads=1) as loader:
        expected = _rows(loader)
    loader = DataLoader(dataset, batch_size=512, cpu_processes=2)
    os.unlink(path)
    if replacement == "fifo":
        os.mkfifo(path)
    elif replacement == "file":
        np.zeros(4096 * 512, np.uint16).tofile(path)
    with ready(loader):
        rows = _rows(loader)
    assert (rows[:, :4] == expected[:, :4]).all()
    assert (rows[:, 5] != os.getpid()).all()


def test_a_mapped_file_whose_loaders_descriptor_is_gone_fails_naming_it() -> None:
    # Each worker opens the file through the loader's descriptor of it (/proc/<pid>/fd/<n>):
    # with the loader's process gone, its start fails saying so, not with a bare ENOENT.
    from asyncloader._file_mapped import Place, _mapped_buffer

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    place = Place(int(gone.stdout), 3, 0, 0, 0)
    with pytest.raises(OSError, match=r"cannot be opened through the loader's descriptor"):
        _mapped_buffer(place, 1 << 16, False)


def _private_kib(pid: int) -> int:
    """The memory ``pid`` holds that no other process shares, in KiB."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        fields = dict(line.split()[:2] for line in rollup if line.startswith("Private"))
    return int(fields["Private_Clean:"]) + int(fields["Private_Dirty:"])


def test_the_workers_share_the_loaded_work_instead_of_each_loading_a_copy() -> None:
    # 48 MiB of bytes objects, which pickle in band: each worker loaded its own copy of them
    # before (about 48 MiB private each), where torch's forked workers share the loader's.
    dataset = proc_data.HoldsBytes(768, 64 << 10)
    with ready(DataLoader(dataset, batch_size=64, cpu_processes=2)) as loader:
        batches = [np.asarray(batch) for batch in loader]
        pids = _all_loaded(loader)
        private = [_private_kib(pid) for pid in pids]
    assert [batch[0, 0] for batch in batches] == [(64 * n) % 251 for n in range(12)]
    assert len(private) == 2
    assert max(private) < 16 << 10, private


def test_a_work_whose_loading_opens_a_file_is_loaded_by_each_worker(tmp_path: Any) -> None:
    # Forked from the zygote, the workers would share one file offset between them.
    (tmp_path / "data").write_bytes(b"x")
    for path, shared in ((None, True), (str(tmp_path / "data"), False)):
        loader = ready(DataLoader(proc_data.WhereLoaded(64, path), batch_size=4, cpu_processes=2))
        with loader:
            rows = _rows(loader)
            procs = loader._runtime_here().procs
            assert procs is not None
            assert procs.zygote is not None
            zygote = procs.zygote.process.pid
        assert os.getpid() not in rows[:, 1]
        if shared:
            assert (rows[:, 0] == zygote).all()
        else:
            assert (rows[:, 0] == rows[:, 1]).all()


def test_a_work_whose_loading_starts_a_thread_is_loaded_by_fresh_workers() -> None:
    # No fork is safe from a zygote that runs a thread: each worker is a fresh interpreter.
    loader = ready(
        DataLoader(proc_data.WhereLoaded(64, thread=True), batch_size=4, cpu_processes=2)
    )
    with loader:
        rows = _rows(loader)
        pids = _all_loaded(loader)
        commands = []
        for pid in pids:
            with open(f"/proc/{pid}/cmdline", "rb") as command:
                commands.append(command.read())
    assert (rows[:, 0] == rows[:, 1]).all()
    assert set(rows[:, 1]) <= set(pids)
    assert all(b"import alone" in command for command in commands), commands


def test_a_write_to_a_shared_array_stays_in_the_worker_that_made_it() -> None:
    dataset = proc_data.HoldsArray(64, writes=True)
    before = dataset.table[:, :4].astype(np.int64)
    with ready(DataLoader(dataset, batch_size=16, cpu_processes=1)) as loader:
        first, second = _rows(loader), _rows(loader)
    assert (first[:, :4] == before + 1).all()
    assert (second[:, :4] == before + 2).all()  # the worker's own copy of those pages
    assert (dataset.table[:, :4] == before).all()  # the loader's dataset: untouched


def test_a_read_only_array_stays_read_only_in_the_workers() -> None:
    dataset = proc_data.HoldsArray(64, readonly=True)
    with ready(DataLoader(dataset, batch_size=16, cpu_processes=1)) as loader:
        rows = _rows(loader)
    assert rows[:, 4].all()
    assert not rows[:, 5].any()


def test_a_replacement_loads_the_work_as_built_whatever_the_dataset_became() -> None:
    dataset = proc_data.Images(16)
    with DataLoader(dataset, batch_size=4, cpu_processes=1) as loader:
        dataset.handle = threading.Lock()  # type: ignore[attr-defined]  # e.g. a file opened
        first = _batches(loader, 1)
        [pid] = _all_loaded(loader)
        os.kill(pid, signal.SIGKILL)
        procs = loader._runtime_here().procs
        assert procs is not None
        deadline = time.monotonic() + 30
        while procs.workers[0].process.pid in (None, pid) or not procs.workers[0].ready:
            assert time.monotonic() < deadline, "no worker took the dead one's place"
            time.sleep(0.01)
        _same(_batches(loader, 1), first)


def _whole(epochs: list[list[Any]], expected: list[Any]) -> None:
    """Each of ``epochs`` (outcomes, as :func:`run_epoch` gives them) failed no batch and
    gave ``expected``'s."""
    failed = [
        [type(b).__name__ for b in epoch if not isinstance(b, np.ndarray)] for epoch in epochs
    ]
    assert failed == [[]] * len(epochs)
    _same([[np.asarray(b) for b in e] for e in epochs], expected * len(epochs))


def _noticed(procs: Any, dead: Any) -> None:
    """Wait until ``procs`` has seen its worker ``dead`` die (it takes no job after)."""
    deadline = time.monotonic() + 30
    while dead in procs.workers:
        assert time.monotonic() < deadline, "the dead worker was never noticed"
        time.sleep(0.01)


def _zygote_killed(loader: DataLoader) -> tuple[Any, Any]:
    """``loader``'s pool, and its zygote, killed (SIGKILL) and reaped."""
    procs = loader._runtime_here().procs
    assert procs is not None
    zygote = procs.zygote
    assert zygote is not None
    zygote.process.kill()
    zygote.process.wait(10.0)
    return procs, zygote


def _replaced(procs: Any, zygote: Any) -> Any:
    """The zygote that took ``zygote``'s place in ``procs``, once there is one."""
    deadline = time.monotonic() + 30
    while procs.zygote is zygote:
        assert time.monotonic() < deadline, "no zygote took the dead one's place"
        time.sleep(0.001)
    return procs.zygote


@pytest.mark.parametrize("together", [False, True], ids=["apart", "together"])
def test_a_server_killed_after_its_workers_started_is_started_again_for_a_new_worker(
    together: bool,
) -> None:
    # The zygote holds the loaded work, as large as a worker's, so the OOM killer may take it
    # (alone, or with a worker). Its workers serve on; until session 41 the next worker to die
    # could not be replaced and every batch of every later epoch failed, saying the server
    # "was killed by signal SIGKILL as it loaded the work".
    with ready(DataLoader(proc_data.Images(16), batch_size=4, cpu_processes=2)) as loader:
        expected = _batches(loader, 1)
        pid = _all_loaded(loader)[0]
        procs = loader._runtime_here().procs
        assert procs is not None
        assert procs.zygote is not None
        dying = procs.workers[0]
        zygote = procs.zygote.process
        zygote.kill()
        if not together:
            zygote.wait(10.0)
            _same(_batches(loader, 1), expected)  # its workers serve on
        os.kill(pid, signal.SIGKILL)
        _noticed(procs, dying)
        epochs = [run_epoch(loader) for _ in range(2)]
        _whole(epochs, expected)
        assert len(_all_loaded(loader)) == 2  # both workers' places filled
        assert procs.zygote.process is not zygote


def test_a_server_killed_again_as_it_loads_the_work_is_started_again() -> None:
    # The zygote started in a killed one's place, killed in turn before its worker loaded the
    # work (the OOM killer again): it was taken for work that cannot load, and every later
    # batch failed.
    with ready(DataLoader(proc_data.Images(16), batch_size=4, cpu_processes=2)) as loader:
        expected = _batches(loader, 1)
        pid = _all_loaded(loader)[0]
        procs, first = _zygote_killed(loader)
        os.kill(pid, signal.SIGKILL)
        second = _replaced(procs, first)
        second.process.kill()  # as it imports what the work needs
        _replaced(procs, second)
        epochs = [run_epoch(loader) for _ in range(2)]
        _whole(epochs, expected)
        assert len(_all_loaded(loader)) == 2


def test_servers_killed_each_time_they_load_the_work_break_the_pool_after_a_few(
    tmp_path: Any,
) -> None:
    data = proc_data.KilledWhenLoadedAgain(16, str(tmp_path / "loaded"))
    with ready(DataLoader(data, batch_size=4, cpu_processes=1)) as loader:
        pid = _all_loaded(loader)[0]
        procs, zygote = _zygote_killed(loader)
        os.kill(pid, signal.SIGKILL)
        started = []
        for _ in range(_processes.RESTARTS + 1):  # the first replacement, then RESTARTS more
            zygote = _replaced(procs, zygote)
            started.append(zygote)
        deadline = time.monotonic() + 30
        while procs._broken is None:
            assert time.monotonic() < deadline, "the pool never gave up"
            time.sleep(0.01)
        assert procs.zygote is started[-1]  # no more than RESTARTS started
        assert str(procs._broken).startswith(
            "the asyncloader worker processes' server was killed by signal SIGKILL as it "
            "loaded the work"
        )
        assert procs.could_not_start  # the next epoch starts the workers again
        assert all(z.process.wait(10.0) == -signal.SIGKILL for z in started)


def test_a_worker_killed_as_it_starts_in_a_dead_ones_place_is_replaced(tmp_path: Any) -> None:
    # Killed before it loaded the work (the OOM killer again), the replacement was taken for
    # one that cannot load it, and every later batch failed.
    data = proc_data.KilledAtLoad(16, str(tmp_path), kill_at=(3,))
    with ready(DataLoader(data, batch_size=4, cpu_processes=1)) as loader:
        expected = _batches(loader, 1)
        [pid] = _all_loaded(loader)
        procs = loader._runtime_here().procs
        assert procs is not None
        dying = procs.workers[0]
        os.kill(pid, signal.SIGKILL)  # its replacement is load 3, killed as it loads
        _noticed(procs, dying)
        epochs = [run_epoch(loader) for _ in range(2)]
    assert sorted(os.listdir(tmp_path)) == ["1", "2", "3", "4"]
    _whole(epochs, expected)


@pytest.mark.parametrize("processes", [1, 4])
def test_a_server_killed_as_it_first_loads_the_work_is_started_again(
    tmp_path: Any, processes: int
) -> None:
    # SIGKILL is never the work's own doing (the OOM killer, as the zygote loads the dataset):
    # every batch of every epoch failed, "... server was killed by signal SIGKILL as it loaded
    # the work", as for work that cannot load. Its death is one, however many workers wait.
    data = proc_data.KilledAtLoad(16, str(tmp_path), kill_at=(1,))
    with ready(DataLoader(data, batch_size=4, cpu_processes=processes)) as loader:
        epochs = [run_epoch(loader) for _ in range(2)]
        assert len(_all_loaded(loader)) == processes
    assert len(os.listdir(tmp_path)) == 2 + processes  # killed, then the zygote and workers
    with DataLoader(proc_data.Images(16), batch_size=4) as loader:
        expected = [list(loader)] * 2
    _same([[np.asarray(b) for b in e] for e in epochs], expected)


def test_servers_killed_each_time_they_first_load_the_work_break_the_pool_after_a_few(
    tmp_path: Any,
) -> None:
    killed = 1 + _processes.RESTARTS
    data = proc_data.KilledAtLoad(16, str(tmp_path), kill_at=range(1, killed + 1))
    with DataLoader(data, batch_size=4, cpu_processes=1) as loader:
        procs = loader._runtime_here().procs
        assert procs is not None
        assert procs.wait_ready(30.0)  # broken
        assert len(os.listdir(tmp_path)) == killed
        assert str(procs._broken) == (
            "the asyncloader worker processes' server was killed by signal SIGKILL as it "
            f"loaded the work (the dataset, transform and collate_fn) for the workers ({killed} "
            "times in a row; the next epoch starts the workers again)"
        )
        epoch = run_epoch(loader)  # the kills stopped: a new zygote and worker
        assert loader._runtime_here().procs is not procs
        assert len(_all_loaded(loader)) == 1
    assert len(os.listdir(tmp_path)) == killed + 2
    with DataLoader(proc_data.Images(16), batch_size=4) as loader:
        _same([[np.asarray(b) for b in epoch]], [list(loader)])


def test_a_worker_whose_server_was_killed_is_still_stopped_by_the_loader(tmp_path: Any) -> None:
    # Its exit was the zygote's to report: once the zygote was gone, the loader took each of
    # its workers for ended, so it could no longer kill one. A worker stuck in a call was
    # never replaced (every later batch timed out) and outlived close().
    data = proc_data.HangsOnce(12, hang_at=5, marker=str(tmp_path / "hung"))
    with ready(DataLoader(data, batch_size=2, cpu_processes=1, timeout=0.5)) as loader:
        [pid] = _all_loaded(loader)
        watch = os.pidfd_open(pid)
        try:
            procs = loader._runtime_here().procs
            assert procs is not None
            assert procs.zygote is not None
            procs.zygote.process.kill()
            procs.zygote.process.wait(10.0)
            iterator = iter(loader)
            assert [len(next(iterator)) for _ in range(2)] == [2, 2]
            with pytest.raises(TimeoutError):
                next(iterator)
            iterator.close()  # type: ignore[attr-defined]  # the stuck worker is replaced
            deadline = time.monotonic() + 30  # a new zygote starts it: longer than timeout=0.5
            while procs.workers[0].process.pid in (None, pid) or not procs.workers[0].ready:
                assert time.monotonic() < deadline, "no worker took the stuck one's place"
                time.sleep(0.01)
            assert [len(batch) for batch in loader] == [2] * 6
            assert select.select([watch], [], [], 10.0)[0] == [watch], "the stuck one lives on"
        finally:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(watch, signal.SIGKILL)
            os.close(watch)


def test_a_worker_whose_threads_cannot_start_is_closed_cleanly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As at interpreter shutdown on 3.12 and later, where no new thread starts: a loader left
    # unclosed at exit is closed by its finalizer while its workers start.
    start = threading.Thread.start

    def refused(thread: threading.Thread) -> None:
        if thread.name.startswith("asyncloader-worker-"):
            raise RuntimeError("can't create new thread at interpreter shutdown")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refused)
    loader = DataLoader(proc_data.Images(8), batch_size=4, cpu_processes=1)
    procs = loader._runtime_here().procs
    assert procs is not None
    assert procs.wait_ready(30.0)  # broken: it says why
    [worker] = procs.workers
    loader.close()  # no RuntimeError from joining a thread never started
    assert worker.process.join(10.0)
    work = loader._runtime_here().work
    assert work is not None
    fd = work.descriptor()
    try:  # no descriptor of the work left open but the loader's own
        assert _work_memory("self").count(os.fstat(fd).st_ino) == 2  # with this one
    finally:
        os.close(fd)


def test_a_workers_exception_keeps_its_type_and_carries_the_workers_traceback() -> None:
    loader = ready(DataLoader(proc_data.Failing(12, fail_at=5), batch_size=4, cpu_processes=1))
    with loader:
        outcomes = run_epoch(loader)
    assert isinstance(outcomes[1], ValueError)
    message = str(outcomes[1])
    assert message.startswith("item 5 is bad")
    assert "in asyncloader worker process 0" in message
    assert "proc_data.py" in message
    assert "raise ValueError" in message
    assert [np.array(b).shape for b in (outcomes[0], outcomes[2])] == [(4, 12, 12, 3)] * 2
    assert loader.stats().errors == 1


def test_an_exception_that_pickle_cannot_rebuild_from_its_args_keeps_its_type() -> None:
    # As a thread would raise it: the user's own type, attributes and message, which a
    # `except BadItem:` in the training loop catches. It came as a WorkerError before (as in
    # torch, whose workers' exceptions of such types come as a RuntimeError).
    loader = ready(
        DataLoader(proc_data.Failing(12, fail_at=5, how="own"), batch_size=4, cpu_processes=1)
    )
    with loader:
        outcomes = run_epoch(loader)
    error = outcomes[1]
    assert type(error) is proc_data.BadItem
    assert (error.index, error.reason) == (5, "is bad")
    assert str(error).startswith("item 5 is bad")
    assert "in asyncloader worker process 0" in str(error)
    assert 'raise BadItem(index, "is bad")' in str(error)
    assert [np.array(b).shape for b in (outcomes[0], outcomes[2])] == [(4, 12, 12, 3)] * 2


def test_a_system_exit_from_the_users_code_fails_its_batch_and_keeps_the_worker() -> None:
    # As on a CPU thread: the batch's error, of its own type. It ended the worker before
    # (a WorkerError, "exited with code 1", and a new worker started).
    loader = ready(
        DataLoader(proc_data.Failing(12, fail_at=5, how="sysexit"), batch_size=4, cpu_processes=1)
    )
    with loader:
        procs = loader._runtime_here().procs
        assert procs is not None
        [pid] = proc_data.worker_pids(loader)  # ready, and its fork reported
        outcomes: list[Any] = []
        iterator = iter(loader)
        for _ in range(3):
            try:
                outcomes.append(next(iterator))
            except BaseException as raised:  # SystemExit is not an Exception
                outcomes.append(raised)
        assert isinstance(outcomes[1], SystemExit)
        assert outcomes[1].code == 3
        if sys.version_info >= (3, 11):  # where exceptions have notes
            notes = "".join(getattr(outcomes[1], "__notes__", []))
            assert "in asyncloader worker process 0" in notes
        assert [np.array(b).shape for b in (outcomes[0], outcomes[2])] == [(4, 12, 12, 3)] * 2
        assert procs.workers[0].process.pid == pid


def test_skip_drops_the_failing_item_and_counts_it_here() -> None:
    loader = ready(
        DataLoader(proc_data.Failing(12, fail_at=5), batch_size=4, cpu_processes=1, errors="skip")
    )
    with loader:
        sizes = [len(batch) for batch in loader]
        assert sizes == [4, 3, 4]
        assert loader.stats().skipped == 1
        assert loader.stats().items == 11


def test_a_batch_whose_every_item_is_skipped_in_a_worker_is_passed_over() -> None:
    loader = ready(
        DataLoader(proc_data.Failing(6, fail_at=2), batch_size=1, cpu_processes=1, errors="skip")
    )
    with loader:
        iterator = loader.iter_with_indices()
        assert [indices for indices, _ in iterator] == [[0], [1], [3], [4], [5]]
        assert loader.stats().skipped == 1


def test_an_async_fetch_that_fails_under_skip_leaves_its_batch_short() -> None:
    loader = DataLoader(
        proc_data.AsyncFailing(12, fail_at=5),
        batch_size=4,
        item_concurrency=4,
        cpu_processes=1,
        errors="skip",
        transform=proc_data.augment(),
    )
    with ready(loader):
        # The lanes drop the item; the worker transforms and collates the rest.
        assert [len(batch) for batch in loader] == [4, 3, 4]
        assert loader.stats().skipped == 1


def test_skip_over_budget_fails_the_batch() -> None:
    loader = DataLoader(
        proc_data.Failing(12, fail_at=5),
        batch_size=4,
        cpu_processes=1,
        errors="skip",
        max_errors=0,
    )
    ready(loader)
    with loader:
        outcomes = run_epoch(loader)
    assert isinstance(outcomes[1], SkipBudgetExceeded)
    assert "item 5 is bad" in str(outcomes[1])


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("segfault", "killed by signal SIGSEGV"),
        ("kill", "killed by signal SIGKILL"),
        ("exit", "exited with code 7"),
    ],
)
def test_a_worker_that_dies_fails_only_the_batches_it_held(how: str, said: str) -> None:
    loader = ready(
        DataLoader(proc_data.Failing(40, fail_at=9, how=how), batch_size=2, cpu_processes=2)
    )
    with loader:
        outcomes = run_epoch(loader)
        # The batch of item 9 (a worker holds at most two); every other batch whole and right.
        assert 4 in _failed_as_held(outcomes, said)
        # It was replaced: the next epoch runs on two live workers, and dies at item 9 again.
        again = run_epoch(loader)
        assert isinstance(again[4], WorkerError)
        assert sum(not isinstance(o, BaseException) for o in again) >= len(again) - 2


@pytest.mark.timeout(120)
def test_a_worker_that_dies_is_seen_to_die_whatever_it_forked(tmp_path: Path) -> None:
    # A process that the worker forked (a fork pool of the dataset's) held copies of the
    # worker's socket to the loader, which sees a worker's death as that socket's end: the
    # worker dead, its batch waited until the loader's timeout (for ever without one).
    marker = tmp_path / "forked"
    loader = DataLoader(
        proc_data.DiesAfterAFork(40, die_at=9, marker=str(marker)),
        batch_size=2,
        cpu_processes=2,
        timeout=10.0,
    )
    try:
        with ready(loader):
            outcomes = run_epoch(loader)
        assert 4 in _failed_as_held(outcomes, "exited with code 7")
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.kill(int(marker.read_text()), signal.SIGKILL)


def _failed_as_held(outcomes: list[Any], said: str = "") -> list[int]:
    """The batches of an epoch of ``proc_data.Images(40)`` by twos that failed: one or two (a
    worker holds at most two), each a ``WorkerError`` that says ``said``; every other batch
    right."""
    failed = [n for n, outcome in enumerate(outcomes) if isinstance(outcome, BaseException)]
    assert 1 <= len(failed) <= 2, failed
    for n, outcome in enumerate(outcomes):
        if n in failed:
            assert isinstance(outcome, WorkerError)
            assert said in str(outcome)
        else:
            assert np.array(outcome)[:, 0, 0, 0].tolist() == [
                proc_data.Images(40)[i][0, 0, 0] for i in (2 * n, 2 * n + 1)
            ]
    return failed


class _Proxy:
    """A worker's connection, wrapped: what a subclass does not change goes to it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class _LateSend(_Proxy):
    """A worker's connection whose send of one job is held up, as a thread preempted inside
    ``send_bytes`` is: its descriptor taken, the worker killed (SIGKILL, as the OOM killer
    does), and the write made only once the worker has been replaced (or after 2 s)."""

    def __init__(self, pool: Any, indices: list[int]) -> None:
        super().__init__(pool.workers[0].conn)
        self.pool, self.worker, self.indices = pool, pool.workers[0], indices
        self.held_up = threading.Event()

    def send_bytes(self, message: bytes) -> None:
        import pickle
        import struct

        numbered = pickle.loads(message)  # (the job's number, the job), or None: stop
        if numbered is None or numbered[1][1] != self.indices:
            self.conn.send_bytes(message)
            return
        fd = self.conn.fileno()
        self.held_up.set()
        os.kill(self.worker.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while self.pool.workers[0] is self.worker and time.monotonic() < deadline:
            time.sleep(0.005)  # polls the pool: no event tells of a replacement
        os.write(fd, struct.pack("!i", len(message)) + message)


def test_a_job_sent_as_its_worker_dies_never_reaches_the_replacement() -> None:
    # The dead worker's descriptors were closed while its sending thread could still be in
    # a write: the replacement's socket took their numbers, and that job went to the new
    # worker, whose answer was then taken for another batch's (or found none: an IndexError
    # in the receiving thread, seen once in a full run on Python 3.12, session 33).
    loader = ready(DataLoader(proc_data.Images(40), batch_size=2, cpu_processes=1))
    with loader:
        pool = loader._runtime_here().procs
        assert pool is not None
        late = _LateSend(pool, [10, 11])
        pool.workers[0].conn = late  # type: ignore[assignment]
        outcomes = run_epoch(loader)
        assert late.held_up.is_set()
    # The batch held up; the one before it if the worker still held it.
    assert 5 in _failed_as_held(outcomes)


class _Renumbered(_Proxy):
    """A worker's connection on which its third answer comes back with another job's number,
    as an answer to a job it was not given (a stray write's) would."""

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.answers = 0

    def recv_bytes(self) -> bytes:
        import pickle

        message: bytes = self.conn.recv_bytes()
        self.answers += 1
        if self.answers != 3:
            return message
        number, reply, logged = pickle.loads(message)
        return pickle.dumps((number + 1000, reply, logged), protocol=5)


def test_a_worker_that_answers_a_job_it_was_not_given_is_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An answer was taken for the worker's oldest job, whichever job it answered: a stray
    # job's answer gave its images to another batch, with no error (as the test above made
    # happen). Now each job goes with its number, and an answer that does not carry its
    # worker's oldest job's fails the batches the worker held, and the worker is replaced.
    loader = ready(DataLoader(proc_data.Images(40), batch_size=2, cpu_processes=1))
    with loader, caplog.at_level("WARNING", logger="asyncloader"):
        pool = loader._runtime_here().procs
        assert pool is not None
        renumbered = _Renumbered(pool.workers[0].conn)
        pool.workers[0].conn = renumbered  # type: ignore[assignment]
        outcomes = run_epoch(loader)
        assert renumbered.answers >= 3
        again = run_epoch(loader)  # on the new worker
    # The third answer's batch, and the next if the worker held it too.
    _failed_as_held(outcomes, "answered a job it was not given")
    assert not any(isinstance(outcome, BaseException) for outcome in again)
    assert any("answered a job it was not given" in r.getMessage() for r in caplog.records)


class _ShortOfDescriptors(_Proxy):
    """A worker's connection on which its first answer with new shared memory says there is
    one segment more than the descriptors that follow it, as an answer does whose worker
    died before it sent them."""

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.cut = False

    def recv_bytes(self) -> bytes:
        import pickle

        message: bytes = self.conn.recv_bytes()
        if self.cut:
            return message
        number, reply, logged = pickle.loads(message)
        if reply[0] != "ok" or not reply[3]:
            return message
        self.cut = True
        reply = (*reply[:3], [*reply[3], (reply[3][-1][0] + 1, 4096)], *reply[4:])
        return pickle.dumps((number, reply, logged), protocol=5)


def test_an_answer_without_its_descriptors_fails_its_batch_and_the_epoch_goes_on() -> None:
    # A ValueError ended the receiving thread, and the batch was never answered: the epoch
    # waited for ever (seen in a run of the test above, whose worker was killed between its
    # answer and its descriptors).
    loader = ready(DataLoader(proc_data.Images(40), batch_size=2, cpu_processes=1))
    with loader:
        pool = loader._runtime_here().procs
        assert pool is not None
        short = _ShortOfDescriptors(pool.workers[0].conn)
        pool.workers[0].conn = short  # type: ignore[assignment]
        outcomes = run_epoch(loader)
        assert short.cut
        again = run_epoch(loader)  # on the new worker
    _failed_as_held(outcomes)
    assert not any(isinstance(outcome, BaseException) for outcome in again)


def test_a_worker_that_dies_between_its_ready_and_its_memory_is_replaced_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seen in a run of random kills: a replacement killed just after it said it was ready,
    # before the descriptor of its shared memory came, raised IndexError in the thread that
    # receives from it ("Exception in thread asyncloader-worker-0-receive"). Its death cannot
    # be timed there; the descriptor is taken from the message instead, as its death does.
    recv_fds = socket.recv_fds
    armed = threading.Event()
    cut: list[socket.socket] = []

    def dead_after_ready(sock: socket.socket, *args: Any) -> Any:
        data, fds, flags, address = recv_fds(sock, *args)
        if armed.is_set() and not cut:
            cut.append(sock)
            for fd in fds:
                os.close(fd)
            return b"", [], flags, address
        return data, fds, flags, address

    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda hooked: raised.append(hooked.exc_value))
    monkeypatch.setattr(socket, "recv_fds", dead_after_ready)
    with ready(DataLoader(proc_data.Images(16), batch_size=4, cpu_processes=1)) as loader:
        expected = _batches(loader, 1)
        procs = loader._runtime_here().procs
        assert procs is not None
        [pid] = _all_loaded(loader)
        dying = procs.workers[0]
        armed.set()
        os.kill(pid, signal.SIGKILL)
        _noticed(procs, dying)
        epochs = [run_epoch(loader) for _ in range(2)]
    assert cut
    assert raised == []
    _same([[np.asarray(b) for b in e] for e in epochs], expected * 2)


def test_an_unpicklable_dataset_fails_at_construction_naming_the_attribute() -> None:
    with pytest.raises(
        TypeError,
        match=r"cpu_processes: the dataset \(Unpicklable\).*"
        r"dataset\.guard\.lock cannot be pickled",
    ):
        DataLoader(proc_data.Unpicklable(4), cpu_processes=1)


def _starting_then_ready(dataset: Any) -> list[Any]:
    """The outcomes of two epochs of ``dataset`` (6 items) by twos, kept as they are: the
    first made on the loader's thread while one worker starts, the second by that worker."""
    with DataLoader(dataset, batch_size=2, cpu_processes=1, collate_fn=list) as loader:
        starting = run_epoch(loader)  # its first batch is made here
        ready(loader)
        outcomes = starting + run_epoch(loader)
    assert len(outcomes) == 6
    return outcomes


@pytest.mark.parametrize(
    ("dataset", "raised", "said"),
    [
        (
            proc_data.LockedItems(6),
            TypeError,
            "cpu_processes: this batch cannot go back to the loader's process, which takes "
            "batches pickled: cannot pickle '_thread.lock' object; return",
        ),
        (
            proc_data.AsyncLockedItems(6),
            WorkerError,
            "a batch's items cannot be pickled: cannot pickle '_thread.lock' object; with "
            "cpu_processes, an async dataset's or a stream's items go to the worker processes "
            "pickled",
        ),
    ],
    ids=["batch", "items"],
)
def test_what_cannot_cross_fails_every_batch_also_those_made_as_the_workers_start(
    dataset: Any, raised: type[BaseException], said: str
) -> None:
    # The batches made here while the workers start never cross: they were delivered, and
    # the same items failed once the workers were ready, so a batch's fate hung on timing.
    for outcome in _starting_then_ready(dataset):
        assert isinstance(outcome, raised), outcome
        assert said in str(outcome)


@pytest.mark.parametrize(
    "dataset",
    [proc_data.ItemsWithNoRoom(6), proc_data.AsyncItemsWithNoRoom(6)],
    ids=["batch", "items"],
)
def test_memory_short_as_a_batch_crosses_is_not_taken_for_what_cannot_cross(
    dataset: Any,
) -> None:
    # A MemoryError as a batch (or its items) was pickled was told to return what pickles.
    for outcome in _starting_then_ready(dataset):
        assert isinstance(outcome, MemoryError), outcome
        assert str(outcome).startswith("no room to pickle this"), outcome
        assert "return what pickles" not in str(outcome)


def test_work_that_cannot_be_loaded_in_a_worker_fails_every_batch_saying_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The log said "asyncloader worker process 0 exited with code None", and the same of
    # process 1: neither was ever forked, and their server had said why.
    with caplog.at_level("WARNING", logger="asyncloader"):
        loader = ready(DataLoader(proc_data.LoadsOnlyHere(8), batch_size=4, cpu_processes=2))
        with loader:
            for outcome in run_epoch(loader) + run_epoch(loader):
                assert isinstance(outcome, ValueError)
                assert str(outcome).startswith("this dataset cannot be loaded in a worker")
                assert "__setstate__" in str(outcome)  # the worker's traceback
    said = [record.getMessage() for record in caplog.records]
    assert said == [
        "asyncloader: the worker processes cannot run the work, and every batch fails: "
        "ValueError: this dataset cannot be loaded in a worker"
    ]


@pytest.mark.parametrize(
    ("dataset", "said"),
    [
        (proc_data.EndsAsLoaded(8, 3), "exited with code 3"),
        (proc_data.EndsAsLoaded(8, signal.SIGSEGV, signal=True), "was killed by signal SIGSEGV"),
    ],
)
def test_work_whose_loading_ends_the_process_fails_every_batch_naming_how(
    dataset: Any, said: str
) -> None:
    # The zygote loads the work once for the workers: it was the process that ended, and the
    # batches said "worker process 0 exited with code None as it started".
    with ready(DataLoader(dataset, batch_size=4, cpu_processes=1)) as loader:  # broken, so
        for outcome in run_epoch(loader):
            assert isinstance(outcome, WorkerError)
            assert str(outcome).startswith(
                f"the asyncloader worker processes' server {said} as it loaded the work"
            ), outcome


def test_workers_that_are_never_ready_are_said_to_be_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Their server waits for ever in the dataset's __setstate__: the batches are made on one
    # CPU thread, which was said nowhere. Told at once here, not after 30 s.
    from asyncloader import _processes

    monkeypatch.setattr(_processes, "SLOW_START_S", 0.0)
    with DataLoader(proc_data.WaitsAsLoaded(16), batch_size=4, cpu_processes=2) as loader:
        with caplog.at_level("WARNING", logger="asyncloader"):
            for _ in range(2):
                assert len(run_epoch(loader)) == 4  # made on the thread, every batch
        said = [r.getMessage() for r in caplog.records if "not ready" in r.getMessage()]
        assert len(said) == 1
        assert said[0].startswith("asyncloader: the 2 worker processes are not ready")
    monkeypatch.undo()  # workers that start as they should: nothing said
    loader = ready(DataLoader(proc_data.Images(16), batch_size=4, cpu_processes=2))
    with loader, caplog.at_level("WARNING", logger="asyncloader"):
        run_epoch(loader)
    assert len([r for r in caplog.records if "not ready" in r.getMessage()]) == 1


def test_closing_while_the_workers_still_load_the_work_ends_their_server_at_once() -> None:
    # Their server still loads the work (here for ever; a script's imports, a dataset that
    # opens a remote index, for seconds): close() waited for it to exit, 2.5 s for each
    # worker it had not forked yet, then 5 s for it, before it killed it: 14 s for two
    # workers, on every `with` block's exit, `break` and Ctrl-C of a short run.
    loader = DataLoader(proc_data.WaitsAsLoaded(16), batch_size=4, cpu_processes=2)
    assert len(run_epoch(loader)) == 4  # made on the thread while they load
    procs = loader._runtime_here().procs
    assert procs is not None
    deadline = time.monotonic() + 30
    while procs.zygote is None:  # the epoch may end before the pool has started it
        assert time.monotonic() < deadline, "the workers' server was not started"
        time.sleep(0.01)
    assert not procs.ready
    zygote = procs.zygote.process
    began = time.monotonic()
    loader.close()
    assert time.monotonic() - began < 3.0  # not the 14 s of bounded waits
    assert zygote.poll() == -signal.SIGKILL
    assert all(worker.process.pid is None for worker in procs.workers)  # none was forked


def test_closing_while_fresh_workers_still_load_the_work_ends_them_at_once(
    tmp_path: Any,
) -> None:
    # Each worker a fresh interpreter (the work's loading started a thread), each still
    # loading it: close() waited 2.5 s for each to read its socket, then killed it.
    work = proc_data.WaitsAsLoadedAfresh(16, str(tmp_path / "loaded"))
    loader = DataLoader(work, batch_size=4, cpu_processes=2)
    assert len(run_epoch(loader)) == 4
    procs = loader._runtime_here().procs
    assert procs is not None
    pids = [worker.process.wait_forked(30.0) for worker in procs.workers]
    assert None not in pids
    assert not procs.ready
    began = time.monotonic()
    loader.close()
    assert time.monotonic() - began < 3.0  # not the 5 s of bounded waits
    assert _gone([pid for pid in pids if pid is not None])


def test_a_compiled_function_in_the_work_does_not_break_the_workers() -> None:
    # Its type's module (Cython's _cython_3_2_8, made at run time) was among the modules the
    # zygote imports, and no import finds it there: every batch of a dataset that held a
    # pyarrow table failed ("No module named '_cython_3_2_8'") where the zygote's own imports
    # had not made it (Python 3.10, pyarrow 25.0.1).
    loader = ready(DataLoader(proc_data.HoldsCompiled(8), batch_size=4, cpu_processes=1))
    with loader:
        outcomes = run_epoch(loader)
    assert [type(outcome) for outcome in outcomes] == [np.ndarray] * 2


def test_an_unpicklable_transform_fails_at_construction_naming_it() -> None:
    with pytest.raises(TypeError, match=r"cpu_processes: the transform \(function\)"):
        DataLoader(proc_data.Images(4), cpu_processes=1, transform=lambda i, x: x)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"cpu_processes": 0}, r"cpu_processes must be at least 1"),
        ({"cpu_processes": 1.5}, r"cpu_processes must be an int"),
        ({"cpu_processes": 2, "cpu_threads": 2}, r"cpu_threads=2 and cpu_processes=2 are excl"),
        ({"cpu_processes": 1, "item_concurrency": 4}, r"item_concurrency=4 with cpu_processes"),
    ],
)
def test_bad_settings_fail_at_construction_naming_them(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        DataLoader(proc_data.Images(4), **settings)


def _memory_of(array: np.ndarray[Any, Any]) -> object:
    """What finally owns an array's memory (the end of its ``base`` chain)."""
    owner: object = array
    while True:
        if isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        elif isinstance(owner, memoryview):
            owner = owner.obj
        else:
            return owner


def test_batches_come_back_in_shared_memory_reused_once_dropped() -> None:
    loader = ready(
        DataLoader(
            proc_data.Images(64, size=32), batch_size=4, cpu_processes=1, collate_fn=ImageCollator()
        )
    )
    addresses = set()
    with loader:
        for batch in loader:
            assert isinstance(_memory_of(batch), mmap.mmap)  # the worker's segment, uncopied
            addresses.add(batch.ctypes.data)
            del batch
        # 16 batches, each dropped before the next is taken: a few segments, reused.
        assert len(addresses) <= loader.num_workers + loader.prefetch_depth + 3
        kept = list(loader)  # all kept: each its own memory, none overwritten
        assert len({batch.ctypes.data for batch in kept}) == len(kept)
        for n, batch in enumerate(kept):
            assert np.array_equal(batch[0], proc_data.Images(64, 32)[4 * n].transpose(2, 0, 1))


def test_the_default_collate_writes_into_shared_memory_too() -> None:
    with ready(DataLoader(proc_data.Images(8), batch_size=4, cpu_processes=1)) as loader:
        batches = list(loader)
    # After close: the batches stay valid (the memory is this process's mapping too).
    gc.collect()
    assert np.array_equal(batches[1][3], proc_data.Images(8)[7])
    assert all(isinstance(_memory_of(batch), mmap.mmap) for batch in batches)


@pytest.mark.parametrize("structured", [False, True])
def test_arrays_of_objects_are_collated_as_on_threads(structured: bool) -> None:
    # References cannot live in shared memory: such a batch is made in the worker's own.
    dataset = proc_data.HoldsObjects(8, structured)
    with ready(DataLoader(dataset, batch_size=4, cpu_processes=1)) as loader:
        batches = run_epoch(loader)
    with DataLoader(dataset, batch_size=4) as loader:
        expected = list(loader)
    assert [batch.dtype for batch in batches] == [batch.dtype for batch in expected]
    assert [batch.tolist() for batch in batches] == [batch.tolist() for batch in expected]


def test_a_break_cancels_and_the_next_epoch_is_whole(no_leaked_threads: None) -> None:
    loader = DataLoader(proc_data.Images(40), batch_size=4, cpu_processes=2, seed=0)
    for batch in loader:
        assert batch.shape[0] == 4
        break
    assert [len(b) for b in loader] == [4] * 10
    loader.close()


def test_a_worker_stuck_in_a_call_is_replaced_once_its_epoch_is_abandoned(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    data = proc_data.HangsOnce(12, hang_at=5, marker=str(tmp_path / "hung"))
    with ready(DataLoader(data, batch_size=2, cpu_processes=1, timeout=0.5)) as loader:
        iterator = iter(loader)
        assert [len(next(iterator)) for _ in range(2)] == [2, 2]
        with pytest.raises(TimeoutError):
            next(iterator)
        with caplog.at_level("WARNING", logger="asyncloader"):
            iterator.close()  # type: ignore[attr-defined]  # the stuck worker is replaced
            assert [len(batch) for batch in loader] == [2] * 6
    # The loader's own kill is no worker's death: it was said as one ("was killed by signal
    # SIGKILL"), which reads as the OOM killer's work.
    assert [r.getMessage() for r in caplog.records] == []


def test_the_next_epoch_never_goes_to_a_worker_stopped_for_the_last(tmp_path: Any) -> None:
    # Ctrl-C amid a job kills the worker that holds it; until its death was seen, that worker
    # took the next epoch's jobs while it had room, and they failed as held by it.
    data = proc_data.Gated(2, str(tmp_path), gated=(1,))
    with ready(DataLoader(data, batch_size=1, cpu_processes=1)) as loader:
        iterator = iter(loader)
        next(iterator)
        procs = loader._runtime_here().procs
        assert procs is not None
        worker = procs.workers[0]
        for _ in range(3000):  # until batch 1 is in the worker, or 30 s
            if worker.held:
                break
            threading.Event().wait(0.01)
        assert len(worker.held) == 1  # its other place is free
        iterator._cancel(wait=False)  # type: ignore[attr-defined]  # as Ctrl-C in next() does
        (tmp_path / "1").touch()
        outcomes = run_epoch(loader)
    assert [type(outcome) for outcome in outcomes] == [np.ndarray] * 2, outcomes
    assert [int(o[0, 0, 0, 0]) for o in outcomes] == [int(data[i][0, 0, 0]) for i in range(2)]


async def test_aclose_stops_the_workers_without_holding_the_callers_loop(tmp_path: Any) -> None:
    # aclose() stopped the worker processes on the caller's loop: a worker amid a call held
    # every other coroutine of that loop up to 5 s (then it was killed), and one that exits at
    # once still 40-180 ms (asyncio's debug mode names the step).
    data = proc_data.Gated(8, str(tmp_path), gated=(5,))
    loader = ready(DataLoader(data, batch_size=4, cpu_processes=1))
    batches = aiter(loader)
    await anext(batches)
    procs = loader._runtime_here().procs
    assert procs is not None
    for _ in range(3000):  # until item 5's batch is in the worker (its gate waits 30 s)
        if procs.workers[0].held:
            break
        await asyncio.sleep(0.01)
    closing = asyncio.create_task(loader.aclose())
    for _ in range(100):  # the loop's own turns while the worker waits
        if closing.done():
            break
        await asyncio.sleep(0.01)
    assert not closing.done()  # still stopping the worker, and the loop went on meanwhile
    (tmp_path / "5").touch()
    await closing
    assert loader._runtime is None


def test_resume_with_processes_is_exact() -> None:
    assert_equal_output_after_checkpoint(
        lambda: DataLoader(
            proc_data.Images(30),
            batch_size=4,
            shuffle=True,
            seed=5,
            transform=proc_data.augment(),
            cpu_processes=2,
        ),
        epochs=2,
    )


def _child(script: str, timeout: float = 60.0, **options: Any) -> subprocess.CompletedProcess[str]:
    """``script`` run in a child, after the imports it shares; ``options`` for ``subprocess.run``
    (its ``input``, a session of its own)."""
    prelude = "import os, sys, signal, time\nfrom asyncloader import DataLoader\n"
    prelude += "from tests import proc_data\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        **options,
    )


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited: gone, or a zombie that no one reaped yet (an orphan's new
    parent may be slow to)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or the read
        return True


def _gone(pids: list[int], within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(_exited(pid) for pid in pids):
            return True
        time.sleep(0.05)  # polling processes that exit on their own; not a race
    return False


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


@pytest.mark.timeout(120)
def test_nothing_is_left_in_dev_shm_after_close_an_exception_or_sigkill() -> None:
    before = _shm()
    script = """
    if __name__ == "__main__":
        loader = DataLoader(proc_data.Images(4000), batch_size=8, cpu_processes=2)
        it = iter(loader)
        first = next(it)
        pids = proc_data.worker_pids(loader)
        for _ in range(8):  # batches from the workers, whose memory is shared
            next(it)
        print(" ".join(map(str, pids)), flush=True)
        if sys.argv[1] == "close":
            loader.close()
        elif sys.argv[1] == "raise":
            raise RuntimeError("the training step failed")
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    """
    for how in ("close", "raise", "kill"):
        process = subprocess.run(
            [
                sys.executable,
                "-c",
                "import os, sys, signal\nfrom asyncloader import "
                "DataLoader\nfrom tests import proc_data\n" + textwrap.dedent(script),
                how,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        pids = [int(pid) for pid in process.stdout.split()]
        assert len(pids) == 2, process.stderr
        if how == "close":
            assert process.returncode == 0, process.stderr
        assert _gone(pids), f"{how}: workers {pids} outlived the loader"
        assert _shm() == before, f"{how}: left in /dev/shm: {_shm() - before}"


@pytest.mark.timeout(120)
def test_batches_come_back_under_a_containers_small_dev_shm() -> None:
    # Docker gives a container a /dev/shm of 64 MiB, where torch's workers put each batch:
    # a batch larger than what is left fails there ("unable to allocate shared memory", or a
    # bus error). The workers' memory is nameless (memfd), outside /dev/shm: here 1 MiB of
    # /dev/shm, in a mount namespace of the child's own, and batches of 4.3 MB.
    script = """
    if __name__ == "__main__":
        import os
        import numpy as np
        shm = os.statvfs("/dev/shm")
        print("shm", shm.f_blocks * shm.f_frsize)
        images = proc_data.Images(12, size=600)
        loader = DataLoader(
            images, batch_size=4, cpu_processes=2, transform=proc_data.stamped
        )
        it = iter(loader)
        batches = [next(it)]
        pids = proc_data.worker_pids(loader)  # the next epoch's batches are all theirs
        batches += [*it, *loader]
        for number, batch in enumerate(batches):
            first = 4 * (number % 3)
            expected = np.stack([images[i] for i in range(first, first + 4)])
            assert np.array_equal(batch["image"], expected), number
        assert set(np.concatenate([b["pid"] for b in batches[3:]])) <= set(pids), pids
        print("batches", len(batches), batches[-1]["image"].nbytes)
    """
    prelude = "from asyncloader import DataLoader\nfrom tests import proc_data\n"
    small = 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$0" -c "$1"'
    namespace = ["unshare", "--user", "--map-root-user", "--mount"]
    done = subprocess.run(
        [*namespace, "sh", "-c", small, sys.executable, prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["shm", str(2**20), "batches", "6", str(4 * 600 * 600 * 3)]


def _oom_score_adj(pid: int | str) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as file:
        return int(file.read())


@pytest.mark.parametrize("own", [0, 800])
def test_the_workers_are_the_oom_killers_first_choice(own: int) -> None:
    # A worker's oom_score_adj is raised to 500, never lowered (a container's may be higher);
    # the loader's process and the workers' server keep theirs.
    done = _child(
        f"""
        if __name__ == "__main__":
            with open("/proc/self/oom_score_adj", "w") as file:
                file.write("{own}")
            loader = DataLoader(
                proc_data.Images(16), batch_size=4, cpu_processes=2, transform=proc_data.stamped
            )
            it = iter(loader)
            next(it)
            pids = proc_data.worker_pids(loader)
            with open(f"/proc/{{pids[0]}}/stat") as stat:
                server = stat.read().rsplit(")", 1)[1].split()[1]
            adjusted = {{
                int(pid): int(adj)
                for batch in loader
                for pid, adj in zip(batch["pid"], batch["oom_score_adj"])
            }}
            assert set(adjusted) <= set(pids), (adjusted, pids)
            print(*set(adjusted.values()), open(f"/proc/{{server}}/oom_score_adj").read())
            loader.close()
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(max(own, 500)), str(own)]
    assert _oom_score_adj("self") == 0


@contextlib.contextmanager
def _memory_group(limit: int) -> Iterator[Path]:
    """A real cgroup (v1) of ``limit`` bytes, swap included (a machine with swap would swap
    rather than kill)."""
    with v1_group("memory") as group:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        if (group / "memory.memsw.limit_in_bytes").exists():  # where swap is accounted
            (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
        (group / "memory.swappiness").write_text("0")
        yield group


@pytest.mark.timeout(120)
def test_a_worker_that_takes_the_memory_goes_not_the_training_process() -> None:
    # The OOM killer takes the process that holds the most memory: here the training process
    # (440 MiB) when a worker takes 300 MiB in a group limited to 700 MiB. That killed the job
    # (the child died of SIGKILL); the worker goes now, its batches fail, the epoch goes on.
    with _memory_group(700 << 20) as group:
        done = _child(
            f"""
            if __name__ == "__main__":
                import numpy as np
                from asyncloader import WorkerError
                with open({str(group / "cgroup.procs")!r}, "w") as procs:
                    procs.write(str(os.getpid()))
                held = np.ones(400 << 20, dtype=np.uint8)  # the model, the optimizer
                loader = DataLoader(proc_data.Balloons(7, 300), batch_size=1, cpu_processes=1)
                outcomes = []
                for epoch in range(2):
                    batches = iter(loader)
                    if epoch == 0:  # the batches made on this thread meanwhile, then theirs
                        outcomes.append(int(next(batches)[0, 0]))
                        proc_data.worker_pids(loader)
                    while True:
                        try:
                            outcomes.append(int(next(batches)[0, 0]))
                        except StopIteration:
                            break
                        except WorkerError as error:
                            assert "SIGKILL" in str(error), error
                            outcomes.append(-1)
                print(*outcomes, "survived", int(held[-1]))
            """,
            timeout=90,
        )
    assert done.returncode == 0, f"{done.returncode}: {done.stderr}"
    *outcomes, survived, one = done.stdout.split()
    assert (survived, one) == ("survived", "1")
    assert len(outcomes) == 20
    expected = list(range(10)) * 2
    failed = [i for i, got in enumerate(outcomes) if got != str(expected[i])]
    assert failed, "no worker was killed: the OOM killer was never called"
    assert all(outcomes[i] == "-1" for i in failed), outcomes
    assert 7 in failed, outcomes


@pytest.mark.timeout(120)
def test_workers_a_limit_of_processes_stops_say_which_limit() -> None:
    # A container's pids.max (or `ulimit -u`) counts threads and processes: under one too
    # low for the workers, every batch after the first few said "the worker processes could
    # not start: can't start new thread", naming no limit, with no cause.
    with v1_group("pids") as group:
        (group / "pids.max").write_text("6")
        done = _child(
            f"""
            if __name__ == "__main__":
                with open({str(group / "cgroup.procs")!r}, "w") as procs:
                    procs.write(str(os.getpid()))
                loader = DataLoader(proc_data.Images(64), batch_size=4, cpu_processes=2)
                said = set()
                for batch in proc_data.outcomes(loader):
                    if isinstance(batch, Exception):
                        said.add(f"{{type(batch).__name__}}: {{batch}} <- {{batch.__cause__!r}}")
                print(*sorted(said), sep="\\n")
            """
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "WorkerError: the worker processes could not start: can't start new thread (the "
        "system refused a new thread or process: a limit on them, as `ulimit -u` or a "
        "container's pids.max sets, or on memory) <- RuntimeError(\"can't start new thread\")"
    ]


@pytest.mark.timeout(120)
def test_batches_all_kept_need_no_descriptor_or_mapping_each() -> None:
    # Under a descriptor limit of 256: a consumer that keeps 1,500 batches, and a batch of
    # 600 arrays (collate_fn=list), each of which took a shared segment with a descriptor.
    script = """
    import resource
    import numpy as np
    from asyncloader._shared import held_limit

    def segments():
        with open("/proc/self/maps") as maps:
            return sum("memfd:asyncloader " in line for line in maps)

    if __name__ == "__main__":
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        images = proc_data.Images(1500, size=2)
        with DataLoader(images, batch_size=1, cpu_processes=1) as loader:
            assert loader._runtime_here().procs.wait_ready(30.0)  # every batch a worker's
            kept = list(loader)
            assert len(kept) == 1500
            for n, batch in enumerate(kept):
                assert np.array_equal(batch[0], images[n]), n
            assert segments() <= held_limit(1) + 8, segments()
        with DataLoader(images, batch_size=600, cpu_processes=1, collate_fn=list) as loader:
            assert loader._runtime_here().procs.wait_ready(30.0)
            kept = list(loader)
            assert [len(batch) for batch in kept] == [600, 600, 300]
            for n, item in enumerate(item for batch in kept for item in batch):
                assert np.array_equal(item, images[n]), n
        print("ok")
    """
    result = _child(script, timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


RUNNING = """
loader = DataLoader(proc_data.Images(10**6), batch_size=8, cpu_processes=2,
                    transform=proc_data.spin)
it = iter(loader)
next(it)
"""
"""A child's loader in the middle of an endless epoch of GIL-bound work."""


@pytest.mark.timeout(120)
def test_ctrl_c_raises_keyboard_interrupt_and_the_workers_go() -> None:
    result = _child(
        INTERRUPTIBLE
        + "import threading\n"
        + RUNNING
        + textwrap.dedent(
            """
        pids = proc_data.worker_pids(loader)
        print(" ".join(map(str, pids)), flush=True)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            for batch in it:
                pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """
        )
    )
    lines = result.stdout.split("\n")
    assert result.returncode == 0, result.stderr
    assert lines[1] == "interrupted"
    assert _gone([int(pid) for pid in lines[0].split()])


@pytest.mark.timeout(120)
def test_ctrl_c_amid_a_job_says_nothing_of_the_worker_it_stops(tmp_path: Any) -> None:
    # Ctrl-C while a worker holds a job: the loader kills that worker and starts another, and
    # said "asyncloader worker process 0 was killed by signal SIGKILL" as if it had died.
    result = _child(
        INTERRUPTIBLE
        + "import threading\n"
        + textwrap.dedent(
            f"""
        data = proc_data.HangsOnce(12, hang_at=5, marker={str(tmp_path / "hung")!r})
        with DataLoader(data, batch_size=2, cpu_processes=1) as loader:
            assert loader._runtime_here().procs.wait_ready(30.0)
            it = iter(loader)
            print([len(next(it)) for _ in range(2)], flush=True)
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                next(it)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            print([len(batch) for batch in loader], flush=True)
        """
        )
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["[2, 2]", "interrupted", "[2, 2, 2, 2, 2, 2]"]
    assert result.stderr == ""


@pytest.mark.timeout(120)
def test_ctrl_c_as_the_workers_server_starts_leaves_it_whole() -> None:
    # Ctrl-C reaches every process of the terminal's foreground group. The zygote ignored
    # SIGINT only once it had imported asyncloader (0.3 s here): one that came before killed
    # it ("Fatal Python error: init_sys_streams", a KeyboardInterrupt traceback on the
    # terminal), and every later batch failed ("the worker processes' server exited with
    # code 1 as it loaded the work"), a loader that went on after the interrupt broken.
    # Here the SIGINT goes to the zygote alone, as soon as it runs, ignored or not yet.
    result = _child(
        """
        def children():
            found = []
            for task in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{task}/children") as listed:
                        found += [int(pid) for pid in listed.read().split()]
                except OSError:
                    continue  # a thread that ended meanwhile
            return found

        loader = DataLoader(list(range(8)), batch_size=2, cpu_processes=1)
        it = iter(loader)
        deadline, sent = time.monotonic() + 30, False
        while not sent and time.monotonic() < deadline:
            for pid in children():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as command:
                        # (spelt in two, or this script's own command line would match)
                        if b"asyncloader." + b"_zygote import" not in command.read():
                            continue  # forked, not yet the zygote's interpreter
                except OSError:
                    continue
                os.kill(pid, signal.SIGINT)
                sent = True
        assert sent, "no zygote seen"
        print([batch.tolist() for batch in it], flush=True)
        assert loader._runtime_here().procs.wait_ready(30.0), "no worker started"
        print([batch.tolist() for batch in loader], flush=True)
        loader.close()
        """
    )
    assert result.returncode == 0, result.stderr
    epoch = "[[0, 1], [2, 3], [4, 5], [6, 7]]"
    assert result.stdout.splitlines() == [epoch, epoch]
    assert result.stderr == ""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sent", ["SIGTERM", "SIGUSR1", "SIGUSR2"])
def test_a_signal_to_the_whole_job_leaves_the_workers_to_the_loader(sent: str) -> None:
    # SLURM (preemption, scancel, the time limit) and systemd send SIGTERM to every process of
    # the job, then SIGKILL after a grace time in which a training loop saves its checkpoint;
    # SLURM's `--signal=USR1@90` (Lightning's auto-requeue) or `USR2` (submitit's) warns every
    # process of the job's steps that its time is nearly up, and the loop's handler saves and
    # requeues. The workers and their server died at once: the loop's next batches failed
    # ("killed by signal SIGTERM", SIGUSR1 until session 44), and so did the save it had the
    # grace time for. torch's workers die so too.
    script = f"""
        asked = []
        signal.signal(signal.{sent}, lambda *_: asked.append(True))  # the loop's own handler
        with DataLoader(proc_data.Images(40), batch_size=4, cpu_processes=2) as loader:
            assert loader._runtime_here().procs.wait_ready(30.0), "no worker started"
            it = iter(loader)
            got = [len(next(it))]
            os.killpg(0, signal.{sent})  # this process, the zygote and the workers
            while not asked:
                signal.sigtimedwait([], 0.01)  # the handler runs in this thread, between these
            got += [len(batch) for batch in it]
            print(got, flush=True)
            print([len(batch) for batch in loader], flush=True)
        """
    done = _child(script, start_new_session=True)  # its own process group, for its killpg
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str([4] * 10)] * 2
    assert done.stderr == ""


@pytest.mark.timeout(120)
def test_a_process_a_worker_starts_takes_ctrl_c_sigterm_and_sigusr() -> None:
    # The workers ignored SIGINT, and what a process ignores, the programs it starts ignore
    # too: a tool that a dataset ran per item could not be stopped by Ctrl-C nor, had SIGTERM
    # been ignored as well, by terminate(). multiprocessing's processes, and torch's workers,
    # start them with Python's defaults.
    with ready(
        DataLoader(proc_data.ChildSignals(), batch_size=None, collate_fn=None, cpu_processes=1)
    ) as loader:
        (found,) = list(loader)
    assert found == "default_int_handler SIG_DFL SIG_DFL SIG_DFL"


def _killed_by_itself(script: str, tmp_path: Path) -> str:
    """The standard output of ``script``, run in a child that ends by killing itself with
    SIGKILL.

    Files take its output, not pipes, which a process the child leaves would hold open."""
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            stdout=stdout,
            stderr=stderr,
            timeout=60,
            cwd=ROOT,
        )
    assert done.returncode == -signal.SIGKILL, out.read_text() + err.read_text()
    return out.read_text()


@pytest.mark.timeout(120)
def test_a_worker_stuck_in_a_call_goes_with_the_loaders_process(tmp_path: Any) -> None:
    # The loader's process killed (the OOM killer, SIGKILL) while a worker ran a call that
    # never returns: the zygote exited as the loader's socket closed, and the worker, which
    # reads its socket only between jobs, lived on as an orphan at 100 % of a core.
    marker = tmp_path / "spinning"
    script = f"""
        import os, signal, threading
        from asyncloader import DataLoader
        from tests import proc_data

        loader = DataLoader(proc_data.SpinsInAWorker({str(marker)!r}), cpu_processes=1)
        assert loader._runtime_here().procs.wait_ready(30.0), "no worker started"

        def kill_once_it_spins():
            while not os.path.exists({str(marker)!r}):
                signal.sigtimedwait([], 0.01)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill_once_it_spins).start()
        list(loader)
        """
    _killed_by_itself(script, tmp_path)
    worker = int(marker.read_text())
    try:
        assert _gone([worker]), "the worker lives on"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_the_workers_go_with_the_loaders_process_whatever_it_forked(tmp_path: Any) -> None:
    # A process that the loader's process forked (a worker of torch's DataLoader, a process
    # of a fork pool) held copies of the loader's sockets to the zygote and the workers: the
    # loader's process killed, they lived on, its loaded work in memory, as long as that one.
    script = """
        import os, signal
        from asyncloader import DataLoader
        from tests import proc_data

        loader = DataLoader(proc_data.Images(8), batch_size=4, cpu_processes=1)
        procs = loader._runtime_here().procs
        assert procs.wait_ready(30.0), "no worker started"
        assert len(list(loader)) == 2
        print(procs.zygote.process.pid, procs.workers[0].process.pid, flush=True)
        forked = os.fork()
        if forked == 0:  # it outlives the loader's process
            signal.sigtimedwait([], 60.0)
            os._exit(0)
        print(forked, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    *pids, forked = (int(pid) for pid in _killed_by_itself(script, tmp_path).split()[:3])
    try:
        assert not _exited(forked)
        assert _gone(pids), "the workers' server and worker live on"
    finally:
        for pid in [*pids, forked]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_exit_without_close_does_not_hang() -> None:
    result = _child(RUNNING + 'print("done")\n')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.timeout(120)
def test_exit_without_close_after_the_zygote_was_killed_is_quiet() -> None:
    # The pidfds through which the loader watches its workers once the zygote is gone were
    # closed at exit before the loader's own finalizer, made earlier, used them: "OSError:
    # [Errno 9] Bad file descriptor" as it stopped the workers.
    script = RUNNING + textwrap.dedent("""
        procs = loader._runtime_here().procs
        assert procs.wait_ready(30.0)
        procs.zygote.process.kill()
        procs.zygote.process.wait(10.0)
        for _ in range(4):
            next(it)
        print("done")
        """)
    result = _child(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert result.stderr == ""


SCRIPT_DATASET = """
import time
import numpy as np
from asyncloader import DataLoader

class Squares:  # defined in the script: the workers must import it
    def __len__(self): return 8
    def __getitem__(self, i): return np.array([i * i])

def epochs():
    loader = DataLoader(Squares(), batch_size=4, cpu_processes=1)
    assert loader._runtime_here().procs.wait_ready(30)
    print([batch.ravel().tolist() for batch in loader])
"""


GUARDED_SCRIPT = SCRIPT_DATASET + "if __name__ == '__main__':\n    epochs()\n"


def _script(
    tmp_path: Any,
    text: str,
    *flags: str,
    env: dict[str, str] | None = None,
    after: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``text`` run as a script, with the interpreter's ``flags`` (the script's own
    arguments with ``after``)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(text))
    command = [str(script), *flags] if after else [*flags, str(script)]
    return subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.mark.timeout(120)
def test_a_script_defining_its_dataset_runs_under_the_main_guard(tmp_path: Any) -> None:
    result = _script(tmp_path, GUARDED_SCRIPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0, 1, 4, 9], [16, 25, 36, 49]]"


@pytest.mark.timeout(120)
def test_a_script_that_parses_its_arguments_as_it_is_imported_gets_the_same_ones(
    tmp_path: Any,
) -> None:
    # The zygote imported the script with sys.argv ['-c']: a script that parses its options
    # at import (outside its main guard) exited there (a required option missing), and
    # every batch failed, or ran with its defaults, not the options given. multiprocessing
    # gives the processes it starts the parent's sys.argv.
    script = """
    import argparse
    import numpy as np
    from asyncloader import DataLoader

    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, required=True)
    ARGS = parser.parse_args()

    class Scaled:
        def __len__(self): return 4
        def __getitem__(self, i): return np.array([i * ARGS.scale])

    if __name__ == "__main__":
        with DataLoader(Scaled(), batch_size=2, cpu_processes=1) as loader:
            assert loader._runtime_here().procs.wait_ready(30)
            print([batch.ravel().tolist() for batch in loader])
    """
    result = _script(tmp_path, script, "--scale", "3", after=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0, 3], [6, 9]]"
    assert result.stderr == "", result.stderr


@pytest.mark.timeout(120)
def test_a_long_sys_path_reaches_the_workers(tmp_path: Any) -> None:
    # The zygote got sys.path in one environment variable, which Linux bounds at 128 KiB:
    # a path of a few hundred entries (Bazel's runfiles, a PEX) could not start a worker,
    # "[Errno 7] Argument list too long", and every batch after the first failed.
    script = """
    import os, sys
    import numpy as np
    from asyncloader import DataLoader

    sys.path += [f"/opt/app.runfiles/package_{i:04d}/site-packages" for i in range(2000)]

    class Pids:
        def __len__(self): return 4
        def __getitem__(self, i): return np.array([os.getpid()])

    if __name__ == "__main__":
        with DataLoader(Pids(), batch_size=2, cpu_processes=1) as loader:
            loader._runtime_here().procs.wait_ready(30)
            pids = {pid for batch in loader for pid in batch.ravel().tolist()}
            print("in a worker", os.getpid() not in pids)
    """
    result = _script(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "in a worker True"


@pytest.mark.timeout(120)
def test_without_the_main_guard_it_gets_a_clear_error(tmp_path: Any) -> None:
    result = _script(
        tmp_path,
        SCRIPT_DATASET
        + "try:\n    epochs()\nexcept Exception as error:\n    print('error:', error)\n",
    )
    assert "error: a DataLoader with cpu_processes was built while a worker process" in (
        result.stdout
    ), result.stdout + result.stderr
    assert "if __name__ == '__main__':" in result.stdout


@pytest.mark.timeout(120)
def test_a_dataset_defined_where_no_file_holds_it_fails_at_construction() -> None:
    # A notebook's cell, the REPL, `python -c`: the workers import the main module to find
    # its classes, and that one has no file. The first batches (made on a thread while the
    # workers start) came, then every other failed, "Can't get attribute 'Squares' on
    # <module '__main__'>", with a warning that a worker "exited with code None".
    result = _child(
        """
        import numpy as np

        class Squares:
            def __len__(self): return 8
            def __getitem__(self, i): return np.array([i * i])

        try:
            DataLoader(Squares(), batch_size=4, cpu_processes=1)
        except TypeError as error:
            print(error)
        loader = DataLoader(proc_data.Images(8), batch_size=4, cpu_processes=1)
        print([len(batch) for batch in loader])
        """
    )
    assert result.returncode == 0, result.stderr
    said, batches = result.stdout.strip().splitlines()
    assert said.startswith("cpu_processes: Squares is defined in __main__, which"), said
    assert "no file holds it" in said
    assert "define it in a module" in said, said
    assert batches == "[4, 4]"
    assert result.stderr == "", result.stderr


PACKAGE_MAIN = """
import numpy as np
from asyncloader import DataLoader
from .helpers import square

class Squares:  # defined in the module run with -m: the workers must import it
    def __len__(self): return 8
    def __getitem__(self, i): return np.array([square(i)])

def epochs():
    try:
        loader = DataLoader(Squares(), batch_size=4, cpu_processes=1)
    except TypeError as error:
        print("refused:", error)
        return
    assert loader._runtime_here().procs.wait_ready(30)
    print([batch.ravel().tolist() for batch in loader])
    loader.close()

if __name__ == "__main__":
    epochs()
"""


def _package(tmp_path: Any, main: str) -> subprocess.CompletedProcess[str]:
    """``python -m`` of module ``main`` of a package whose modules import each other."""
    package = tmp_path / "job"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("def square(i):\n    return i * i\n")
    (package / f"{main}.py").write_text(PACKAGE_MAIN)
    module = "job" if main == "__main__" else f"job.{main}"
    return subprocess.run(
        [sys.executable, "-m", module],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.timeout(120)
def test_a_module_run_with_python_m_is_imported_by_its_name(tmp_path: Any) -> None:
    # `python -m job.train`, the dataset defined in train.py, which imports `.helpers`: the
    # zygote imported the main module by its path, where a relative import has no package,
    # and every batch failed (after the first, made on a thread) "attempted relative import
    # with no known parent package". multiprocessing imports such a module by its name.
    result = _package(tmp_path, "train")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0, 1, 4, 9], [16, 25, 36, 49]]"
    assert result.stderr == "", result.stderr


@pytest.mark.timeout(120)
def test_a_dataset_defined_in_a_packages_main_fails_at_construction(tmp_path: Any) -> None:
    # `python -m job`, the dataset defined in job/__main__.py: importing it runs the
    # package's main code (no guard there is its own), so no worker can find the class
    # (multiprocessing does not import such a file either).
    result = _package(tmp_path, "__main__")
    assert result.returncode == 0, result.stderr
    said = result.stdout.strip()
    assert said.startswith("refused: cpu_processes: Squares is defined in __main__, which"), said
    assert "define it in a module" in said


@pytest.mark.timeout(120)
def test_a_script_whose_dataset_lives_in_a_module_needs_no_guard(tmp_path: Any) -> None:
    result = _script(
        tmp_path,
        """
        from asyncloader import DataLoader
        from tests import proc_data
        loader = DataLoader(proc_data.Images(8), batch_size=4, cpu_processes=1)
        assert loader._runtime_here().procs.wait_ready(30)
        print([len(batch) for batch in loader])
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[4, 4]"


WARNING_DATASET = """
import warnings
import numpy as np
from asyncloader import DataLoader

class Warns:  # as Pillow warns of a palette image's transparency, for one item of four
    def __len__(self): return 8
    def __getitem__(self, i):
        if i % 4 == 1:
            warnings.warn(f"item {i} is odd", UserWarning)
        return np.array([i])

def epoch(how):
    loader = DataLoader(Warns(), batch_size=2, **how)
    if "cpu_processes" in how:
        assert loader._runtime_here().procs.wait_ready(30)
    said, batches = [], iter(loader)
    for _ in range(len(loader)):
        try:
            said.append(next(batches).ravel().tolist())
        except UserWarning:
            said.append("UserWarning")
    loader.close()
    return said

if __name__ == "__main__":
    print(epoch({"cpu_threads": 1}))
    print(epoch({"cpu_processes": 2}))
"""


@pytest.mark.timeout(120)
def test_the_workers_take_the_interpreters_warning_options(tmp_path: Any) -> None:
    # `python -W error::UserWarning train.py`: the thread's batches failed with the
    # UserWarning, the workers' only printed it. multiprocessing passes a child the
    # interpreter's options (torch's spawned workers get them so), the zygote got none.
    result = _script(tmp_path, WARNING_DATASET, "-W", "error::UserWarning")
    assert result.returncode == 0, result.stderr
    threads, processes = result.stdout.strip().splitlines()
    assert threads == "['UserWarning', [2, 3], 'UserWarning', [6, 7]]"
    assert processes == threads
    assert "UserWarning" not in result.stderr, result.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env", [{"PYTHONDEVMODE": "1"}, {"PYTHONWARNINGS": "always"}])
def test_the_zygote_leaves_nothing_unclosed_at_its_exit(tmp_path: Any, env: dict[str, str]) -> None:
    # The zygote's socket was left to be collected at its exit: "ResourceWarning: unclosed
    # <socket.socket ...>" on every loader's close, where warnings are shown.
    result = _script(tmp_path, GUARDED_SCRIPT, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0, 1, 4, 9], [16, 25, 36, 49]]"
    assert result.stderr == "", result.stderr


@pytest.mark.timeout(120)
def test_a_job_that_a_worker_starts_may_start_worker_processes_of_its_own() -> None:
    # The zygote marked its environment, to tell a script that builds its loader as it is
    # imported. Every process a worker started inherited the mark: a separate job's loader
    # with cpu_processes failed there, said to be a script without its main guard.
    with ready(
        DataLoader(proc_data.RunsAJob(), batch_size=2, collate_fn=list, cpu_processes=1)
    ) as jobs:
        (batch,) = list(jobs)
    assert batch == ["[[0, 1], [2, 3]]", "[[1, 2], [3, 4]]"]


async def test_an_async_epoch_on_the_callers_loop() -> None:
    async with DataLoader(proc_data.Images(10), batch_size=4, cpu_processes=1) as loader:
        got = [batch.shape async for batch in loader]
    assert got == [(4, 12, 12, 3), (4, 12, 12, 3), (2, 12, 12, 3)]
    await asyncio.sleep(0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("thread", [False, True], ids=["forked", "fresh"])
def test_a_worker_reads_nothing_of_the_loaders_stdin(thread: bool) -> None:
    # The zygote, and so every worker, inherited the loader's stdin: a worker that read it
    # took the lines piped to the training script (and a `breakpoint()` in a worker read the
    # terminal beside the script's own). multiprocessing gives its processes, and so torch's
    # workers, /dev/null.
    script = f"""
        dataset = proc_data.ReadsStdin(2, thread={thread})
        with DataLoader(dataset, batch_size=1, collate_fn=list, cpu_processes=1) as loader:
            assert loader._runtime_here().procs.wait_ready(30.0), "no worker started"
            print([batch for batch in loader])
        print(repr(sys.stdin.read()))
        """
    done = _child(script, input="first\nsecond\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[[''], ['']]", repr("first\nsecond\n")]


@pytest.mark.parametrize("thread", [False, True], ids=["forked", "fresh"])
def test_what_the_workers_log_reaches_the_loaders_handlers(
    thread: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker's interpreter has no handler of the loader's: what a dataset logged there at
    # INFO was dropped, and a WARNING came out as its bare message on stderr, where torch's
    # forked workers log through the training script's configuration.
    caplog.set_level(logging.INFO, logger="proc_data")
    loader = DataLoader(proc_data.Chatty(thread), batch_size=4, collate_fn=list, cpu_processes=2)
    with ready(loader):
        assert [batch for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    records = [r for r in caplog.records if r.name == "proc_data.chatty"]
    assert sorted(r.getMessage() for r in records if r.levelno == logging.INFO) == sorted(
        f"item {index}" for index in range(8)
    )
    assert {r.process for r in records} & {os.getpid(), None} == set()
    assert {r.processName for r in records} <= {"asyncloader-worker-0", "asyncloader-worker-1"}
    assert not [r for r in records if r.levelno == logging.DEBUG]
    failed = [r for r in records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failed] == ["item 3 failed"]
    assert failed[0].exc_text is not None
    assert "ValueError: item 3 is odd" in failed[0].exc_text
    assert "ValueError: item 3 is odd" in caplog.text
    (odd,) = [r for r in records if r.getMessage() == "item 5"]
    assert "_thread.lock object" in odd.__dict__["lock"]  # its repr: a lock cannot cross


@pytest.mark.parametrize(
    "dataset", [proc_data.StreamOfImages(6), proc_data.AsyncImages(6)], ids=["stream", "async"]
)
def test_what_a_transform_logs_in_the_workers_reaches_the_loaders_handlers(
    dataset: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The items are read in the loader's process; only the transform and collate_fn run in
    # the workers, whose answers carry the records back the same way.
    caplog.set_level(logging.INFO, logger="proc_data")
    loader = DataLoader(dataset, batch_size=3, cpu_processes=2, transform=proc_data.logged)
    with ready(loader):
        assert [len(batch) for batch in loader] == [3, 3]
    records = [r for r in caplog.records if r.name == "proc_data.transform"]
    assert sorted(r.getMessage() for r in records) == [f"transformed item {i}" for i in range(6)]
    assert {r.processName for r in records} <= {"asyncloader-worker-0", "asyncloader-worker-1"}


def test_a_job_that_logs_without_end_carries_back_a_bounded_part_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="proc_data")
    loader = DataLoader(proc_data.Garrulous(1500), batch_size=1, collate_fn=list, cpu_processes=1)
    with ready(loader):
        assert [batch for batch in loader] == [[0], [1]]
    for index in range(2):
        said = [
            r.getMessage() for r in caplog.records if r.getMessage().startswith(f"item {index},")
        ]
        assert said == [f"item {index}, line {line}" for line in range(_logs.LIMIT)]
    dropped = [r for r in caplog.records if "were dropped" in r.getMessage()]
    assert [(r.name, r.levelno) for r in dropped] == [("asyncloader", logging.WARNING)] * 2
    assert dropped[0].getMessage() == (
        f"{1500 - _logs.LIMIT} records logged in one job past its first {_logs.LIMIT} were dropped"
    )


def test_a_worker_that_configures_its_own_logging_logs_once() -> None:
    script = """
        import logging
        logging.basicConfig(stream=sys.stdout, format="loader: %(message)s", level="INFO")
        dataset = proc_data.Chatty(configure=True)
        with DataLoader(dataset, batch_size=8, collate_fn=list, cpu_processes=1) as loader:
            assert loader._runtime_here().procs.wait_ready(30.0), "no worker started"
            print([batch for batch in loader])
        """
    done = _child(script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    said = [line for line in lines if re.fullmatch(r"\w+: item \d", line)]
    assert sorted(said) == [f"here: item {index}" for index in range(8)]
    assert lines[-1] == "[[0, 1, 2, 3, 4, 5, 6, 7]]"


def test_what_the_workers_print_to_a_pipe_comes_out_once() -> None:
    # stdout to a pipe or a file (a job's log under SLURM, `| tee`) is block-buffered: a
    # forked worker ended by `os._exit` dropped what it had printed, every line of it, where
    # multiprocessing's processes (torch's workers) flush at exit, and flush before a fork so
    # that no child writes its parent's buffer again.
    script = """
        with DataLoader(proc_data.Prints(), batch_size=2, collate_fn=list, cpu_processes=2) as l:
            assert l._runtime_here().procs.wait_ready(30.0), "no worker started"
            assert [batch for batch in l] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = _child(script, env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == sorted(
        ["loaded", *(f"item {index}" for index in range(8))]
    )


def test_the_workers_follow_the_loaders_warning_filters() -> None:
    # A script's warnings.filterwarnings() did not reach the workers, which forked torch
    # workers inherit: a warning silenced there came out of every worker, once an item, and
    # one made an error there did not fail its batch as it does on a thread.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=proc_data.Noisy)
        with DataLoader(proc_data.Warns(), batch_size=2, cpu_processes=2) as loader:
            outcomes = run_epoch(ready(loader))
    assert [type(outcome) for outcome in outcomes] == [proc_data.Noisy] * 2
    assert "noisy item" in str(outcomes[0])


def test_a_warning_silenced_in_the_script_is_silent_in_the_workers() -> None:
    script = """
        import warnings
        warnings.filterwarnings("ignore", message="noisy")
        with DataLoader(proc_data.Warns(), batch_size=2, cpu_processes=2) as loader:
            assert loader._runtime_here().procs.wait_ready(30.0), "no worker started"
            print([batch.tolist() for batch in loader])
        """
    done = _child(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[[0, 1], [2, 3]]"
    assert "noisy" not in done.stderr


def test_warnings_captured_by_logging_in_the_script_are_logged_from_the_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("default", proc_data.Noisy)  # not an error, as pytest has it
        logging.captureWarnings(True)
        try:
            with DataLoader(proc_data.Warns(), batch_size=2, cpu_processes=2) as loader:
                assert [batch.tolist() for batch in ready(loader)] == [[0, 1], [2, 3]]
        finally:
            logging.captureWarnings(False)
    said = [r.getMessage() for r in caplog.records if r.name == "py.warnings"]
    assert sorted(line.split(": ", 2)[-1].split("\n")[0] for line in said) == [
        f"noisy item {index}" for index in range(4)
    ]
    assert {r.process for r in caplog.records if r.name == "py.warnings"} & {os.getpid()} == set()


def test_a_worker_that_crashes_dumps_its_traceback_where_the_script_enabled_faulthandler() -> None:
    # faulthandler.enable() in a script (pytest's own, or a training script's) did not reach
    # the workers, which a forked torch worker inherits: a segfault there said only
    # "killed by signal SIGSEGV", not where in the user's code it happened.
    script = """
        import faulthandler
        faulthandler.enable()
        dataset = proc_data.Failing(8, fail_at=3, how="segfault")
        with DataLoader(dataset, batch_size=2, cpu_processes=1) as loader:
            assert loader._runtime_here().procs.wait_ready(30.0), "no worker started"
            print([type(batch).__name__ for batch in run(loader)])
        """
    prelude = "from tests.test_worker_processes import run_epoch as run\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    done = _child(prelude + textwrap.dedent(script), env=env)
    assert done.returncode == 0, done.stderr
    kinds = done.stdout.strip()  # the batch of item 3 failed, and the next if it was held
    assert kinds.startswith("['ndarray', 'WorkerError', ")
    assert kinds.endswith(", 'ndarray']")
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert 'proc_data.py", line' in done.stderr
    assert "in __getitem__" in done.stderr


def _set_up(init: Any, processes: int = 1, batch_size: int = 1) -> DataLoader:
    """A loader of :class:`proc_data.WhichWorker` whose workers run ``init`` as they start."""
    return DataLoader(
        proc_data.WhichWorker(),
        batch_size=batch_size,
        collate_fn=list,
        cpu_processes=processes,
        worker_init_fn=init,
    )


def test_worker_init_fn_runs_in_each_worker_before_its_first_batch() -> None:
    # torch scripts pass worker_init_fn (seeding, a database handle per worker): it was
    # refused, though cpu_processes has worker processes to run it in. Every batch is made in
    # a worker that ran it, the first ones too (none on the loader's thread as they start).
    loader = _set_up(proc_data.set_up_worker, processes=2, batch_size=2)
    with loader:
        assert loader.worker_init_fn is proc_data.set_up_worker
        for _ in range(2):
            items = [item for batch in loader for item in batch]
            assert [index for index, _, _ in items] == list(range(8))
            assert {worker for _, worker, _ in items} <= {0, 1}
            assert os.getpid() not in {pid for _, _, pid in items}
    assert proc_data.WORKER is None  # never run in the loader's process


def test_a_worker_init_fn_that_is_the_datasets_method_sets_up_the_workers_copy() -> None:
    # The method and the dataset cross in one pickle: in a worker, the method is bound to
    # the dataset that worker reads, not to a copy of its own.
    dataset = proc_data.Opener()
    with DataLoader(
        dataset, batch_size=2, collate_fn=list, cpu_processes=2, worker_init_fn=dataset.open
    ) as loader:
        opened = {item for batch in loader for item in batch}
    assert opened <= {"opened by worker 0", "opened by worker 1"}
    assert opened
    assert dataset.opened is None


def test_worker_init_fn_runs_again_in_a_worker_that_takes_a_dead_ones_place() -> None:
    loader = _set_up(proc_data.set_up_worker)
    with loader:
        [(_, worker, first)] = next(iter(loader))
        assert worker == 0
        os.kill(first, signal.SIGKILL)
        assert _gone([first])
        for _ in range(20):  # until the loader has seen it go, and replaced it
            pids = {
                (worker, pid)
                for batch in run_epoch(loader)
                if isinstance(batch, list)
                for _, worker, pid in batch
            }
            if pids and first not in {pid for _, pid in pids}:
                break
        assert {worker for worker, _ in pids} == {0}
        assert first not in {pid for _, pid in pids}


def test_a_worker_init_fn_that_cannot_be_pickled_fails_at_construction_naming_it() -> None:
    with pytest.raises(TypeError, match=r"the worker_init_fn \(function\) cannot be sent"):
        DataLoader(proc_data.WhichWorker(), cpu_processes=1, worker_init_fn=lambda n: None)


def test_a_worker_init_fn_that_fails_fails_every_batch_saying_why() -> None:
    loader = _set_up(proc_data.cannot_set_up, batch_size=4)
    with loader:
        outcomes = run_epoch(loader)
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert isinstance(outcome, proc_data.CannotOpen)
        assert "worker 0 cannot open its database" in str(outcome)
        assert "the worker's traceback" in str(outcome)


def test_a_loader_that_fails_every_batch_gives_each_its_own_error() -> None:
    # Every batch raised the one exception object of what broke the workers, which gathered
    # each raise's frames: 24 frames at the first batch, 600 at the 99th (under a limit of
    # processes that let no worker start), each keeping its locals, for as long as the loop
    # went on catching them.
    with _set_up(proc_data.cannot_set_up) as loader:
        outcomes = [outcome for _ in range(3) for outcome in run_epoch(loader)]
    assert len(outcomes) == 24
    assert all(isinstance(outcome, proc_data.CannotOpen) for outcome in outcomes)
    assert len({id(outcome) for outcome in outcomes}) == 24  # all held: no id reused
    frames = [len(traceback.extract_tb(outcome.__traceback__)) for outcome in outcomes]
    assert max(frames) <= min(frames) + 3, frames
    assert all(str(outcome) == str(outcomes[0]) for outcome in outcomes)
    assert "worker 0 cannot open its database" in str(outcomes[0])


def test_the_workers_import_asyncloader_from_where_the_loader_did(tmp_path: Any) -> None:
    # `python -c` puts the working directory first on sys.path: a package of the same name
    # there (a checkout beside an installed copy, say) would be what the zygote imports.
    shadow = tmp_path / "cwd" / "asyncloader"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the working directory\\'s copy')\n")
    script = tmp_path / "job" / "run.py"
    script.parent.mkdir()
    script.write_text(
        textwrap.dedent(
            """
            from asyncloader import DataLoader

            loader = DataLoader(list(range(6)), batch_size=3, cpu_processes=1)
            assert loader._runtime_here().procs.wait_ready(30.0), "no worker started"
            print([[int(x) for x in b] for b in loader])
            loader.close()
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path / "cwd",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[[0, 1, 2], [3, 4, 5]]"


def test_workers_that_could_not_start_are_started_again_by_the_next_epoch() -> None:
    # Descriptors short as the workers started (RLIMIT_NOFILE at the count open, plus a
    # few): the epoch's later batches fail, "the worker processes could not start". The
    # pool stayed broken: once descriptors were free again every later epoch failed alike,
    # for the loader's life (torch starts its workers again each epoch).
    result = _child(
        """
        import json, resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        outcomes = {}
        for free in range(4, 24, 2):
            loader = DataLoader(proc_data.Images(8), batch_size=4, cpu_processes=1,
                                collate_fn=len)
            listing = os.listdir("/proc/self/fd")  # and the descriptor listing it took
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(listing) - 1 + free, hard))
            first = []
            try:
                for batch in loader:
                    first.append(batch)
            except Exception as error:
                first.append(str(error)[:80])
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            second = []
            for _ in range(2):  # the next epoch, and the one after
                try:
                    second.append(list(loader))
                except Exception as error:
                    second.append(str(error)[:80])
            loader.close()
            outcomes[free] = [first, second]
        print(json.dumps(outcomes))
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = json.loads(result.stdout.splitlines()[-1])
    broke = [
        free
        for free, (first, _) in outcomes.items()
        if any("worker processes could not start" in str(said) for said in first)
    ]
    assert broke, outcomes  # some limit let the epoch start but not its workers
    assert {free: second for free, (_, second) in outcomes.items()} == {
        free: [[4, 4], [4, 4]] for free in outcomes
    }
