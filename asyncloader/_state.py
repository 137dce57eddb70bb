"""Checkpoints of a loader's position: what the consumer received, never what was prefetched.

A state says which epoch the next batch comes from and how many of that epoch's batches the
consumer has already received (failed batches count: their error was delivered). Loading it
makes the next epoch yield exactly the batches not yet received, without fetching the others;
every later epoch is then the same as in an uninterrupted run.

Elastic resume: a state saved by ``N`` ranks, loaded by ``M != N`` ranks, continues that epoch
with the samples no rank had received. Ranks of a data-parallel job move in lockstep, so after
``k`` batches of ``b`` samples the ``N`` ranks together received the first ``N * k * b``
positions of the epoch's shared order; the rest of that order (padding excluded) is shared out
among the ``M`` ranks as a ``DistributedSampler`` would, padded or cut by ``drop_last``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._sampler import DistributedSampler, RandomSampler, Sampler, SequentialSampler, shard

FORMAT: Final = 1
"""The version of the state's layout; a state of another version is refused."""


@dataclass
class Progress:
    """How far the consumer got in the latest epoch (shared with its iterator)."""

    epoch: int
    received: int
    done: bool = False


@dataclass(frozen=True)
class Resume:
    """Where the next epoch starts, from a loaded state."""

    epoch: int
    batches: int
    world_size: int
    shuffle: bool
    seed: int


def order_of(sampler: object) -> tuple[bool, int] | None:
    """``(shuffle, seed)`` of a built-in sampler whose order all ranks share, else ``None``."""
    if isinstance(sampler, DistributedSampler):
        return sampler.shuffle, sampler.seed
    if isinstance(sampler, RandomSampler):
        return True, sampler.seed
    if isinstance(sampler, SequentialSampler):
        return False, 0
    return None


def sampler_state(sampler: object, custom_state: Any) -> dict[str, Any]:
    """What a state records of the sampler."""
    if isinstance(sampler, DistributedSampler):
        return {
            "kind": "distributed",
            "shuffle": sampler.shuffle,
            "seed": sampler.seed,
            "drop_last": sampler.drop_last,
        }
    if isinstance(sampler, RandomSampler):
        return {"kind": "random", "seed": sampler.seed}
    if isinstance(sampler, SequentialSampler):
        return {"kind": "sequential"}
    if isinstance(sampler, Sampler):
        return {"kind": type(sampler).__name__}
    if callable(getattr(sampler, "state_dict", None)):
        return {"kind": "custom", "state": custom_state}
    return {"kind": "iterable"}


def check_compatible(state: object, expected: dict[str, Any]) -> dict[str, Any]:
    """Refuse a state that another loader saved, saying what differs.

    Raises:
        ValueError: The format, dataset length, batch size, ``drop_last`` or sampler differ,
            or the state is not a state.
    """
    if not isinstance(state, dict):
        raise ValueError(f"a loader state is a dict, got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise ValueError(f"state format {state.get('format')!r} differs from {FORMAT}")
    for key in ("dataset_length", "batch_size", "drop_last"):
        if state.get(key) != expected[key]:
            raise ValueError(
                f"state {key} {state.get(key)!r} differs from this loader's {expected[key]!r}"
            )
    for key in ("epoch", "batches_received", "world_size"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"state {key} must be a non-negative int, got {value!r}")
    saved, ours = state.get("sampler") or {}, expected["sampler"]
    saved_kind, our_kind = saved.get("kind"), ours.get("kind")
    shared = {"distributed", "random", "sequential"}
    if saved_kind in shared and our_kind in shared:
        saved_order = (
            saved_kind != "sequential" and saved.get("shuffle", True),
            saved.get("seed", 0),
        )
        our_order = (our_kind != "sequential" and ours.get("shuffle", True), ours.get("seed", 0))
        if saved_order[0] != our_order[0] or (saved_order[0] and saved_order[1] != our_order[1]):
            raise ValueError(f"state sampler {saved} orders the epoch unlike this loader's {ours}")
    elif saved_kind != our_kind:
        raise ValueError(f"state sampler kind {saved_kind!r} differs from {our_kind!r}")
    json.dumps(state)  # a state must stay JSON-serialisable
    return state


def elastic_indices(
    order: Sequence[int],
    saved_world_size: int,
    received_per_rank: int,
    world_size: int,
    rank: int,
    drop_last: bool,
) -> list[int]:
    """This rank's share of the samples no rank had received (see the module docstring)."""
    consumed = saved_world_size * received_per_rank
    return shard(order[consumed:], world_size, rank, drop_last)
