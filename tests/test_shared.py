"""Shared memory between a worker and the loader: both sides in one process, real segments."""

from __future__ import annotations

import gc
import os
from typing import Any

import numpy as np

from asyncloader import _shared
from asyncloader._shared import Arena, Mapped


class _Link:
    """A worker's arena and the loader's mapping of it, as the worker process wires them."""

    def __init__(self) -> None:
        self.arena = Arena()
        self.mapped = Mapped(os.dup(self.arena.control_fd))

    def send(self, value: Any) -> Any:
        data, refs, new, dropped = self.arena.pack(value)
        fds = [os.dup(fd) for fd in self.arena.fds([number for number, _ in new])]
        self.mapped.update(new, fds, dropped)
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
