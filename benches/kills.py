"""Kills: SIGKILL to a loader's worker processes and to their server (the zygote), at drawn
moments, amid and between epochs.

Each round draws a victim (the zygote, a worker, both, both and then the worker that takes the
dead one's place as it starts, or none), a moment (0-300 ms into the epoch) and, with
``--async``, a batch after which the epoch is left (``break``). The loader must go on: each
batch is the right one or a ``WorkerError`` (a batch a killed worker held, or every batch once
the workers were killed as they started four times in a row), the loader's own threads print
nothing, and an epoch after the kills is whole. Fails otherwise, or if a process is left.

The dataset is a map-style one (its items fetched in the workers), an async one (fetched on
the event loop; transformed and collated in the workers) or a stream (read in the loader's
process; the same), with ``--source map|async|stream``.

Run: ``.venv/bin/python benches/kills.py [--seed N] [--rounds N] [--async] [--source S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from asyncloader import DataLoader, WorkerError

VICTIMS = ("zygote", "worker 0", "worker 1", "both", "both, then the new worker", "none")


class Images:
    """Item ``i``: a small image drawn from ``i``."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        return np.random.default_rng(index).integers(0, 256, (12, 12, 3), np.uint8)


class AsyncImages(Images):
    """:class:`Images` as an async dataset."""

    async def __getitem__(self, index: int) -> np.ndarray[Any, Any]:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__getitem__(index)


class StreamOfImages:
    """:class:`Images`' items as a stream, in order."""

    def __iter__(self) -> Iterator[np.ndarray[Any, Any]]:
        data = Images()
        return (data[index] for index in range(len(data)))


SOURCES = {"map": Images, "async": AsyncImages, "stream": StreamOfImages}


def spin(index: int, item: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A transform that holds the GIL a while, so that kills land amid jobs."""
    total = 0
    for step in range(20_000):
        total += step * index
    return item


def _kill(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _strike(procs: Any, victim: str, delay: float) -> None:
    time.sleep(delay)
    workers = list(procs.workers)
    if victim in ("zygote", "both", "both, then the new worker") and procs.zygote is not None:
        _kill(procs.zygote.process.pid)
    if victim != "zygote" and victim != "none" and workers:
        old = workers[1 if victim == "worker 1" else 0]
        _kill(old.process.pid)
        if victim == "both, then the new worker":
            deadline = time.monotonic() + 2.0
            while procs.workers[0] is old and time.monotonic() < deadline:
                time.sleep(0.001)
            if procs.workers[0] is not old:
                _kill(procs.workers[0].process.wait_forked(2.0))


def _check(outcomes: list[Any], expected: list[np.ndarray[Any, Any]]) -> int:
    """How many batches failed; raises if one is wrong or fails otherwise."""
    failed = 0
    for outcome, batch in zip(outcomes, expected, strict=False):
        if isinstance(outcome, WorkerError):
            failed += 1
        elif not isinstance(outcome, np.ndarray) or not np.array_equal(outcome, batch):
            raise AssertionError(f"a wrong batch: {outcome!r}")
    return failed


def _epoch(loader: DataLoader) -> list[Any]:
    outcomes: list[Any] = []
    batches = iter(loader)
    while True:
        try:
            outcomes.append(next(batches))
        except StopIteration:
            return outcomes
        except WorkerError as error:
            outcomes.append(error)


async def _async_epoch(loader: DataLoader, leave_after: int | None) -> list[Any]:
    outcomes: list[Any] = []
    batches = aiter(loader)
    try:
        while leave_after is None or len(outcomes) <= leave_after:
            try:
                outcomes.append(await anext(batches))
            except StopAsyncIteration:
                break
            except WorkerError as error:
                outcomes.append(error)
    finally:
        await batches.aclose()  # type: ignore[attr-defined]
    return outcomes


def _seen(procs: Any) -> set[int]:
    """The pids of ``procs``' zygote and workers now."""
    pids = {worker.process.pid for worker in procs.workers}
    if procs.zygote is not None:
        pids.add(procs.zygote.process.pid)
    return {pid for pid in pids if pid}


def _left(pids: set[int]) -> list[int]:
    """Those of ``pids`` that still run a zygote or a worker (not a process that took a pid)."""
    left = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                if b"asyncloader._zygote" in file.read():
                    left.append(pid)
        except OSError:  # gone
            continue
    return left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--source", choices=sorted(SOURCES), default="map")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    data = Images()
    expected = [np.stack([data[i] for i in range(b, b + 4)]) for b in range(0, 64, 4)]
    loader = DataLoader(SOURCES[args.source](), batch_size=4, cpu_processes=2, transform=spin)
    procs = loader._runtime_here().procs
    raised: list[BaseException | None] = []
    threading.excepthook = lambda hooked: raised.append(hooked.exc_value)
    failed = 0
    pids: set[int] = set()
    for number in range(args.rounds):
        procs = loader._runtime_here().procs  # a new pool where the last could not start
        pids |= _seen(procs)
        victim = rng.choice(VICTIMS)
        leave_after = rng.choice([None, 0, 1, 3, 8]) if args.use_async else None
        striker = threading.Thread(target=_strike, args=(procs, victim, rng.uniform(0, 0.3)))
        striker.start()
        if args.use_async:
            outcomes = asyncio.run(_async_epoch(loader, leave_after))
        else:
            outcomes = _epoch(loader)
        striker.join()
        pids |= _seen(procs)
        if leave_after is None and len(outcomes) != len(expected):
            raise AssertionError(f"round {number}: {len(outcomes)} batches")
        lost = _check(outcomes, expected)
        failed += lost
        print(f"round {number}: {victim}; {len(outcomes)} batches, {lost} failed", flush=True)
    time.sleep(1.0)  # the last round's kills seen: no batch goes to a worker killed just now
    if _check(_epoch(loader), expected):
        raise AssertionError("the epoch after the kills failed batches")
    loader.close()
    if raised:
        raise AssertionError(f"raised in the loader's threads: {raised!r}")
    left = _left(pids)
    if left:
        raise AssertionError(f"processes left: {left}")
    print(f"{args.rounds} rounds, {failed} batches failed, then an epoch whole; nothing left")


if __name__ == "__main__":
    main()
