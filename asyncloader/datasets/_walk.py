"""One epoch's walk through a rank's shards, as a small state that resumes it exactly.

The walk is: the shards opened so far (a prefix of the rank's order), each open shard's place
in the round-robin and the samples taken from it, whose turn is next, which samples wait in the
shuffle buffer (by shard and place in it) and how many draws the buffer has made. Every sample
is named by ``(p, i)``: the ``i``-th sample of the ``p``-th shard of the rank's order. Resuming
re-opens the open shards and skips the samples already taken from them, and reads the buffer's
samples again from their shards: it reads at most the open shards and the buffer's, never the
epoch.

A saved state is checked whole when it is loaded, each field against the others and against the
shards it names; a state that fails any check is refused with a ``ValueError``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final

FORMAT: Final = 1


_MASK: Final = (1 << 64) - 1


def _base(seed: int, epoch: int) -> int:
    digest = hashlib.blake2b(f"asyncloader-shuffle-buffer:{seed}:{epoch}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def draw(base: int, count: int, below: int) -> int:
    """The ``count``-th draw of a walk, in ``range(below)``: SplitMix64 of ``base + count``.

    A counter, not a generator with a state: the walk's state holds the count alone, and a
    resumed walk draws what the uninterrupted one would have.
    """
    z = (base + (count + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) % below


@dataclass
class Walk:
    """Where one epoch's walk is (see the module docstring); mutated as samples are taken."""

    epoch: int
    seed: int
    rank: int
    world_size: int
    shards: int
    """The shards in the rank's order."""
    opened: int
    """Shards of the rank's order opened so far."""
    slots: list[list[int]]
    """``[p, taken]`` for each open shard, in round-robin order."""
    turn: int
    buffered: list[tuple[int, int]] = field(default_factory=list)
    """``(p, i)`` of each sample in the shuffle buffer, in the buffer's order (tuples: a
    state is a shallow copy of the list)."""
    draws: int = 0
    """Draws of the shuffle buffer so far (see :func:`draw`)."""
    plan: list[list[Any]] | None = None
    """For an epoch re-split over other ranks (:func:`regroup`): the rank's units of work,
    ``[shard, skip, keep]`` each (the shard's samples after the first ``skip``, or only those
    at the places in ``keep``); ``None``: the rank's share of the shards, whole."""

    def unit(self, order: list[int], p: int) -> tuple[int, int, list[int] | None]:
        """Position ``p``'s shard, the samples to skip, and the samples to keep."""
        if self.plan is None:
            return order[p], 0, None
        shard, skip, keep = self.plan[p]
        return shard, skip, keep

    @property
    def base(self) -> int:
        """Where the epoch's draws start."""
        return _base(self.seed, self.epoch)

    @classmethod
    def start(
        cls, epoch: int, seed: int, rank: int, world_size: int, shards: int, interleave: int
    ) -> Walk:
        """A walk at the start of its epoch."""
        opened = min(interleave, shards)
        slots = [[p, 0] for p in range(opened)]
        return cls(epoch, seed, rank, world_size, shards, opened, slots, 0)

    def state(self) -> dict[str, Any]:
        """The walk as a JSON-serialisable dict."""
        return {
            "format": FORMAT,
            "epoch": self.epoch,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "shards": self.shards,
            "opened": self.opened,
            "slots": [list(slot) for slot in self.slots],
            "turn": self.turn,
            "buffered": list(self.buffered),
            "draws": self.draws,
            **({} if self.plan is None else {"plan": [list(unit) for unit in self.plan]}),
        }


def _int(state: dict[str, Any], key: str, low: int, high: int | None = None) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"TarShards state {key} must be an int of at least {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"TarShards state {key} must be at most {high}, got {value!r}")
    return value


def _pairs(state: dict[str, Any], key: str, first_below: int) -> list[list[int]]:
    value = state.get(key)
    if not isinstance(value, list):
        raise ValueError(f"TarShards state {key} must be a list, got {type(value).__name__}")
    pairs = []
    for pair in value:
        ok = isinstance(pair, list) and len(pair) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair)
        if not ok or pair[0] >= first_below:
            raise ValueError(f"TarShards state {key}: {pair!r} is not a [shard, count] pair")
        pairs.append([pair[0], pair[1]])
    return pairs


def _plan(value: object, count: int) -> list[list[Any]]:
    if not isinstance(value, list):
        raise ValueError(f"TarShards state plan must be a list, got {type(value).__name__}")
    plan: list[list[Any]] = []
    for unit in value:
        ok = isinstance(unit, list) and len(unit) == 3
        ok = ok and all(_count(v) for v in unit[:2]) and unit[0] < count
        keep = unit[2] if ok else None
        if keep is not None:
            ok = isinstance(keep, list) and all(_count(v) for v in keep)
            ok = ok and keep == sorted(set(keep)) and unit[1] == 0
        if not ok:
            raise ValueError(f"TarShards state plan: {unit!r} is not a [shard, skip, keep] unit")
        plan.append([unit[0], unit[1], keep])
    return plan


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_walk(state: object, interleave: int, buffer_size: int, count: int) -> Walk:
    """A loaded state as a walk, checked whole.

    Raises:
        ValueError: A field is missing, of the wrong type or range, or disagrees with another
            or with these settings; the message names it.
    """
    if not isinstance(state, dict):
        raise ValueError(f"a TarShards state is a dict, got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise ValueError(f"TarShards state format {state.get('format')!r} differs from {FORMAT}")
    epoch, seed = _int(state, "epoch", 0), _int(state, "seed", 0)
    world_size = _int(state, "world_size", 1)
    rank = _int(state, "rank", 0, world_size - 1)
    shards = _int(state, "shards", 0)
    opened = _int(state, "opened", 0, shards)
    slots = _pairs(state, "slots", opened)
    if len(slots) > interleave or len({p for p, _ in slots}) != len(slots):
        raise ValueError(
            f"TarShards state slots {slots} do not fit interleave={interleave} shards open"
        )
    turn = _int(state, "turn", 0, max(len(slots) - 1, 0))
    buffered = [(p, i) for p, i in _pairs(state, "buffered", opened)]
    if len(buffered) > buffer_size:
        raise ValueError(
            f"TarShards state buffers {len(buffered)} samples, over shuffle_buffer={buffer_size}"
        )
    if len({(p, i) for p, i in buffered}) != len(buffered):
        raise ValueError("TarShards state buffered names a sample twice")
    taken = {p: count for p, count in slots}
    if any(p in taken and i >= taken[p] for p, i in buffered):
        raise ValueError("TarShards state buffered names a sample not yet taken from its shard")
    draws = _int(state, "draws", 0)
    plan = _plan(state["plan"], count) if "plan" in state else None
    if plan is not None and len(plan) != shards:
        raise ValueError(f"TarShards state plan has {len(plan)} units, not its shards {shards}")
    walk = Walk(epoch, seed, rank, world_size, shards, opened, slots, turn, buffered, draws)
    walk.plan = plan
    return walk


def regroup(
    walks: list[Walk], orders: list[list[int]], rank: int, world_size: int, interleave: int
) -> Walk:
    """The rest of an epoch that ``len(walks)`` ranks had walked, as rank ``rank`` of
    ``world_size`` walks it: every sample no rank had handed out, exactly once over the new
    ranks.

    The rest is a list of units, the same on every new rank: each old rank's open shards
    from the samples it had taken, then the samples in each old rank's buffer (kept, by shard),
    then the shards no rank had opened (the old ranks' in turn). Rank ``r`` takes units
    ``r``, ``r + world_size``, ...: its plan.
    """
    partial: list[list[Any]] = []
    buffered: list[list[Any]] = []
    pending: list[list[list[Any]]] = []
    for walk, order in zip(walks, orders, strict=True):
        for p, taken in walk.slots:
            shard, skip, keep = walk.unit(order, p)
            rest = [shard, skip + taken, None] if keep is None else [shard, 0, keep[taken:]]
            partial.append(rest)
        places: dict[int, list[int]] = {}
        for p, i in walk.buffered:
            shard, skip, keep = walk.unit(order, p)
            places.setdefault(shard, []).append(skip + i if keep is None else keep[i])
        buffered += [[shard, 0, sorted(kept)] for shard, kept in places.items()]
        pending.append([list(walk.unit(order, p)) for p in range(walk.opened, walk.shards)])
    units = [unit for unit in partial + buffered if unit[2] != []]
    for turn in range(max((len(p) for p in pending), default=0)):
        units += [rank_pending[turn] for rank_pending in pending if turn < len(rank_pending)]
    mine = units[rank::world_size]
    first = walks[0]
    walk = Walk.start(first.epoch, first.seed, rank, world_size, len(mine), interleave)
    walk.plan = mine
    return walk
