"""The GIL-bound workloads of the suite (``suite.py`` (i) and (j), issue 21).

(i) a pure-Python transform of about 0.4 ms per item that holds the GIL throughout (a loop
of additions), batch 32; (j) a training loop whose step holds the GIL for about 5 ms (a
Python loop) and then computes for about 10 ms with the GIL released (SHA-256 of 16 MiB),
over the JPEG chain of (c) per item, batch 32. The step counts are fixed; each run reports
what they took on its machine at that time.

torch is imported only where torch's datasets use it (here and in ``bench_images``): the
workers of ``cpu_processes`` import the modules their work refers to and nothing else, so a
dataset whose module imports torch costs them that import, once, where these do not
(docs/processes.md says what each costs).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import numpy as np

SPIN_STEPS = 17_000
"""About 0.4 ms of pure Python here."""

HOLD_STEPS = 190_000
"""About 5 ms of pure Python here."""

COMPUTE = bytes(16 * 2**20)
"""Hashed with the GIL released: about 10 ms here."""


def spin(index: int, item: Any) -> Any:
    """The GIL-bound transform: a Python loop, then the item unchanged."""
    total = 0
    for step in range(SPIN_STEPS):
        total += step ^ index
    return item


class Numbers:
    """Item ``i`` is a small array from ``i``: nothing to fetch, all the work is the
    transform's."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        return np.full(16, index, dtype=np.float32)


class TorchSpun(Numbers):
    """The same, transformed inside the dataset (torch's loader has no transform)."""

    def __getitem__(self, index: int) -> Any:
        import torch

        return torch.from_numpy(spin(index, super().__getitem__(index)))


def train_step() -> tuple[float, float]:
    """One step: hold the GIL, then compute without it; returns the seconds of each."""
    started = time.perf_counter()
    total = 0
    for step in range(HOLD_STEPS):
        total += step
    held = time.perf_counter()
    hashlib.sha256(COMPUTE).digest()
    return held - started, time.perf_counter() - held


def _spin_batches(start: int, stop: int) -> None:
    numbers = Numbers(stop)
    for first in range(start, stop, 32):
        np.stack([spin(i, numbers[i]) for i in range(first, min(first + 32, stop))])


def two_processes_rate(items: int) -> float:
    """Items per second of the transform and stacking in two forked processes, half the
    items each: what both cores give at the time, with no GIL and no loader."""
    started = time.perf_counter()
    children = []
    for start, stop in ((0, items // 2), (items // 2, items)):
        pid = os.fork()
        if pid == 0:  # the child: its half, then out at once
            code = 1
            try:
                _spin_batches(start, stop)
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError("a process of the two-process plain loop failed")
    return items / (time.perf_counter() - started)


def spin_rate(items: int = 400) -> float:
    """Items per second of the transform in a plain loop on one core."""
    started = time.perf_counter()
    for index in range(items):
        spin(index, None)
    return items / (time.perf_counter() - started)
