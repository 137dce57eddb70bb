"""One epoch's walk through a rank's shards, as a small state that resumes it exactly.

The walk is: the shards opened so far (a prefix of the rank's order), each open shard's place in
the round-robin and the samples taken from it, whose turn is next, which samples wait in the
shuffle buffer (by shard and place in it) and the buffer's random state. Every sample is named
by ``(p, i)``: the ``i``-th sample of the ``p``-th shard of the rank's order. Resuming re-opens
the open shards and skips the samples already taken from them, and reads the buffer's samples
again from their shards: it reads at most the open shards and the buffer's, never the epoch.

A saved state is checked whole when it is loaded, each field against the others and against
the shards it names; a state that fails any check is refused with a ``ValueError``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Final

FORMAT: Final = 1


def _seeded(seed: int, epoch: int) -> random.Random:
    # A str seed is hashed with SHA-512: the same generator in every process and run.
    return random.Random(f"asyncloader-shuffle-buffer:{seed}:{epoch}")


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
    buffered: list[list[int]] = field(default_factory=list)
    """``[p, i]`` of each sample in the shuffle buffer, in the buffer's order."""
    rng: random.Random | None = None

    @classmethod
    def start(
        cls, epoch: int, seed: int, rank: int, world_size: int, shards: int, interleave: int
    ) -> Walk:
        """A walk at the start of its epoch."""
        opened = min(interleave, shards)
        slots = [[p, 0] for p in range(opened)]
        rng = _seeded(seed, epoch)
        return cls(epoch, seed, rank, world_size, shards, opened, slots, 0, [], rng)

    def state(self) -> dict[str, Any]:
        """The walk as a JSON-serialisable dict."""
        assert self.rng is not None
        version, internal, gauss = self.rng.getstate()
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
            "buffered": [list(place) for place in self.buffered],
            "rng": [version, list(internal), gauss],
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


def check_walk(state: object, interleave: int, buffer_size: int) -> Walk:
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
    buffered = _pairs(state, "buffered", opened)
    if len(buffered) > buffer_size:
        raise ValueError(
            f"TarShards state buffers {len(buffered)} samples, over shuffle_buffer={buffer_size}"
        )
    if len({(p, i) for p, i in buffered}) != len(buffered):
        raise ValueError("TarShards state buffered names a sample twice")
    taken = {p: count for p, count in slots}
    if any(p in taken and i >= taken[p] for p, i in buffered):
        raise ValueError("TarShards state buffered names a sample not yet taken from its shard")
    rng = _rng(state.get("rng"))
    return Walk(epoch, seed, rank, world_size, shards, opened, slots, turn, buffered, rng)


def _rng(value: object) -> random.Random:
    refused = ValueError("TarShards state rng is not a random generator's state")
    if not isinstance(value, list) or len(value) != 3 or not isinstance(value[1], list):
        raise refused
    version, internal, gauss = value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in internal):
        raise refused
    rng = random.Random()
    try:
        rng.setstate((version, tuple(internal), gauss))
    except (TypeError, ValueError, OverflowError):
        raise refused from None
    return rng
