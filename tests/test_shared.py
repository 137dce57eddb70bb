"""Shared memory between a worker and the loader: both sides in one process, real segments."""

from __future__ import annotations

import gc
import os
import resource
import sys
from typing import Any

import numpy as np

from asyncloader import _shared
from asyncloader._shared import Arena, Mapped


class _Link:
    """A worker's arena and the loader's mapping of it, as the worker process wires them."""

    def __init__(self, held: int = _shared.HELD_MAX) -> None:
        self.arena = Arena(held)
        self.mapped = Mapped(os.dup(self.arena.control_fd))

    def send(self, value: Any) -> Any:
        data, refs, new, dropped = self.arena.pack(value)
        fds = self.arena.hand_over([number for number, _ in new])
        self.mapped.update(new, fds, dropped)  # closes them, as the worker's send would
        return self.mapped.unpack(data, refs)


def _batch(arena: Arena, nbytes: int, fill: int) -> np.ndarray[Any, Any]:
    _shared.set_arena(arena)
    try:
        out = _shared.empty((nbytes,), np.uint8)
    finally:
        _shared.set_arena(None)
    assert out is not None
    out[:] = fill
    return out


def test_a_batch_arrives_in_the_memory_it_was_written_into() -> None:
    link = _Link()
    got = link.send({"x": _batch(link.arena, 10_000, 7)})
    assert got["x"].tobytes() == bytes([7]) * 10_000
    assert link.arena.created == 1


def test_a_dropped_batchs_segment_is_reused_and_a_held_one_never() -> None:
    link = _Link()
    held = link.send(_batch(link.arena, 50_000, 1))
    dropped = link.send(_batch(link.arena, 50_000, 2))
    del dropped
    gc.collect()
    again = link.send(_batch(link.arena, 50_000, 3))
    assert link.arena.created == 2  # the dropped one's segment, reused
    assert held.tobytes() == bytes([1]) * 50_000  # never written under the loader
    assert again.tobytes() == bytes([3]) * 50_000


def test_a_closed_segments_number_given_to_a_new_one_maps_the_new_one() -> None:
    link = _Link()
    # Free segments of many sizes: the arena keeps a few and closes the rest, then gives a
    # closed one's number to the next new segment.
    for size in range(1, 12):
        link.send(_batch(link.arena, size * 100_000, size))
        gc.collect()
    for size in range(12, 20):
        got = link.send(_batch(link.arena, size * 100_000, size))
        assert got.tobytes() == bytes([size]) * (size * 100_000)
        del got
        gc.collect()


def test_an_array_not_in_shared_memory_is_copied_into_it_once() -> None:
    link = _Link()
    plain = np.arange(1000, dtype=np.int64)
    got = link.send(plain)
    assert np.array_equal(got, plain)
    assert link.arena.created == 1


def test_arrays_not_in_shared_memory_go_into_one_segment_together() -> None:
    link = _Link()
    items = [np.full(n + 1, n, dtype=np.int32) for n in range(500)]
    got = link.send(items)
    assert all(np.array_equal(a, b) for a, b in zip(got, items, strict=True))
    assert link.arena.created == 1
    assert all(item.ctypes.data % 64 == 0 for item in got)  # each aligned for any dtype


def test_past_the_held_limit_batches_come_in_band_and_nothing_is_lost() -> None:
    link = _Link(held=16)
    held = [link.send(_batch(link.arena, 100, n % 251)) for n in range(16)]
    assert link.arena.created == 16
    _shared.set_arena(link.arena)
    try:
        assert _shared.empty((100,), np.uint8) is None  # the collator allocates as usual
    finally:
        _shared.set_arena(None)
    data, refs, new, _ = link.arena.pack(np.arange(100))
    assert (refs, new) == ([], [])  # pickled in band: one copy, no segment
    assert link.mapped.unpack(data, refs).tolist() == list(range(100))
    del held[0]
    gc.collect()
    again = link.send(_batch(link.arena, 100, 7))  # a dropped batch's segment, reused
    assert again.tobytes() == bytes([7]) * 100
    assert link.arena.created == 16
    assert all(batch.tobytes() == bytes([(n + 1) % 251]) * 100 for n, batch in enumerate(held))


def test_a_segment_held_by_the_loader_keeps_no_descriptor_but_its_mappings() -> None:
    # Here both sides are in one process: two mappings of each segment, each of which keeps
    # a descriptor of its own before Python 3.13 (mmap duplicates it), none from 3.13.
    link = _Link()
    before = len(os.listdir("/proc/self/fd"))
    held = [link.send(_batch(link.arena, 10_000, 1)) for _ in range(50)]
    per_mapping = 0 if sys.version_info >= (3, 13) else 1
    assert len(os.listdir("/proc/self/fd")) - before == 2 * per_mapping * len(held)


def test_the_held_limit_leaves_half_the_descriptors_before_python_3_13() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        limits = [_shared.held_limit(processes) for processes in (1, 2, 16, 1000)]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if sys.version_info >= (3, 13):
        assert limits == [_shared.HELD_MAX] * 4
    else:
        assert limits == [512, 256, 32, 4]
