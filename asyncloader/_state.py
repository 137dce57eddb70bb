"""Checkpoints of a loader's position: what the consumer received, never what was prefetched.

A state says which epoch the next batch comes from and how many of that epoch's batches the
consumer has already received (failed batches count: their error was delivered). Loading it
makes the next epoch yield exactly the batches not yet received, without fetching the others;
every later epoch is then the same as in an uninterrupted run.

A state is checked whole before anything changes (:func:`check_state`): every field, its type
and range, its agreement with this loader, and that its position lies inside its epoch. A state
that fails any check is refused with a ``ValueError`` naming the field, and the loader is left
as it was.

Elastic resume: a state saved by ``N`` ranks, loaded by ``M != N`` ranks, continues that epoch
with the samples no rank had received. Ranks of a data-parallel job move in lockstep, so after
``k`` batches of ``b`` samples the ``N`` ranks together received the first ``N * k * b``
positions of the epoch's shared order (after the ``offset`` positions an earlier elastic resume
of the same epoch had already consumed); the rest of that order is shared out among the ``M``
ranks as a ``DistributedSampler`` would, padded or cut by ``drop_last``. A state saved in such
an epoch records that ``offset``, so it resumes into exactly the same shares.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._sampler import (
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    batch_count,
    read_sampler,
    sampler_length,
    shard,
)

FORMAT: Final = 1
"""The version of the state's layout; a state of another version is refused."""

_REQUIRED: Final = (
    "format",
    "epoch",
    "batches_received",
    "seed",
    "dataset_length",
    "batch_size",
    "drop_last",
    "world_size",
    "rank",
    "sampler",
)
_OPTIONAL: Final = ("offset",)
_SHARED_ORDER: Final = frozenset({"distributed", "random", "sequential"})


@dataclass
class Progress:
    """How far the consumer got in the latest epoch (shared with its iterator)."""

    epoch: int
    received: int
    done: bool = False
    offset: int = 0
    """Positions of the epoch's shared order consumed before this share began (elastic)."""
    sampler: Any = None
    """What the state records of the sampler, as it was when the epoch started."""
    stream: Any = None
    """A stream's reader (:class:`._stream.StreamReader`): the stream's own states."""
    batches: int | None = None
    """The epoch's batches in all, where they are known at its start (a map-style epoch):
    once the consumer has received them all, the epoch is over for the state too."""


@dataclass(frozen=True)
class Resume:
    """Where the next epoch starts, from a loaded and checked state."""

    epoch: int
    batches: int
    world_size: int
    offset: int
    state: dict[str, Any]
    """The state as loaded: what :meth:`DataLoader.state_dict` returns until the epoch runs."""


@dataclass(frozen=True)
class Expected:
    """What a state must agree with: this loader's settings and sampler."""

    dataset_length: int
    batch_size: int | None
    drop_last: bool
    seed: int
    adopts_seed: bool
    """Whether the seed was drawn from the OS, so a saved one replaces it."""
    sampler: object
    """The sampler (or batch sampler) that orders the epoch."""
    batch_sampler: bool
    """Whether :attr:`sampler` is a ``batch_sampler`` (it yields whole batches)."""
    world_size: int
    default_sampler: Callable[[int], object] | None
    """The loader's own sampler for a seed, rebuilt when the seed is adopted (``None``: the
    user gave the sampler)."""


def order_of(sampler: object) -> tuple[bool, int] | None:
    """``(shuffle, seed)`` of a built-in sampler whose order all ranks share, else ``None``."""
    if isinstance(sampler, DistributedSampler):
        return sampler.shuffle, sampler.seed
    if isinstance(sampler, RandomSampler):
        return True, sampler.seed
    if isinstance(sampler, SequentialSampler):
        return False, 0
    return None


def _samplers(sampler: object) -> tuple[object, object]:
    """The sampler and the one it wraps, if any (torch's ``BatchSampler`` wraps one)."""
    return sampler, getattr(sampler, "sampler", None)


def _generator(sampler: object) -> Any:
    """A torch ``Generator`` the sampler draws its order from (torch's ``RandomSampler``,
    ``SubsetRandomSampler``, ``WeightedRandomSampler``, or one inside a ``BatchSampler``)."""
    for candidate in _samplers(sampler):
        generator = getattr(candidate, "generator", None)
        if callable(getattr(generator, "get_state", None)) and callable(
            getattr(generator, "set_state", None)
        ):
            return generator
    return None


def _draws_from_torchs_global_generator(sampler: object) -> bool:
    for candidate in _samplers(sampler):
        module = type(candidate).__module__
        if module.startswith("torch.") and "Random" in type(candidate).__name__:
            return getattr(candidate, "generator", "absent") is None
    return False


def capture_sampler(sampler: object) -> dict[str, Any]:
    """What a state records of the sampler, taken now (at the start of an epoch)."""
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
        return {"kind": "custom", "state": sampler.state_dict()}  # type: ignore[attr-defined]
    generator = _generator(sampler)
    if generator is not None:
        raw = bytes(generator.get_state().numpy().tobytes())
        return {"kind": "iterable", "generator": base64.b64encode(raw).decode("ascii")}
    return {"kind": "iterable"}


def _is_int(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _field(state: dict[str, Any], key: str, minimum: int, default: int | None = None) -> int:
    value = state.get(key, default)
    if not _is_int(value, minimum):
        raise ValueError(f"state {key} must be an int of at least {minimum}, got {value!r}")
    assert isinstance(value, int)
    return value


def _check_sampler(saved: object, ours: dict[str, Any], sampler: object) -> bytes | None:
    """Check the state's sampler record against ours; the generator state to restore."""
    if not isinstance(saved, dict) or not isinstance(saved.get("kind"), str):
        raise ValueError(f"state sampler must be a dict with a 'kind', got {saved!r}")
    kind, our_kind = saved["kind"], ours["kind"]
    if kind in _SHARED_ORDER and our_kind in _SHARED_ORDER:
        fields = {"random": ("seed",), "distributed": ("shuffle", "seed", "drop_last")}
        for key in fields.get(kind, ()):
            value = saved.get(key)
            ok = isinstance(value, bool) if key != "seed" else _is_int(value, 0)
            if not ok:
                raise ValueError(f"state sampler {key} is invalid: {value!r}")
        saved_order = (kind != "sequential" and saved.get("shuffle", True), saved.get("seed", 0))
        our_order = (our_kind != "sequential" and ours.get("shuffle", True), ours.get("seed", 0))
        if saved_order[0] != our_order[0] or (saved_order[0] and saved_order[1] != our_order[1]):
            raise ValueError(f"state sampler {saved} orders the epoch unlike this loader's {ours}")
        return None
    if kind != our_kind:
        raise ValueError(f"state sampler kind {kind!r} differs from {our_kind!r}")
    if kind == "custom" and "state" not in saved:
        raise ValueError("state sampler of kind 'custom' has no 'state'")
    encoded = saved.get("generator")
    if kind != "iterable" or encoded is None:
        return None
    generator = _generator(sampler)
    if generator is None:
        raise ValueError("state sampler has a generator state, but this loader's sampler has none")
    try:
        raw = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or len(raw) != generator.get_state().numel():
        raise ValueError("state sampler generator is not a generator state of this sampler")
    return raw


def _batches_in_epoch(expected: Expected, world_size: int, offset: int) -> int | None:
    """The batches one rank's epoch has at that world size and offset, if known."""
    length, drop_last = expected.dataset_length, expected.drop_last
    sampler, batch_size = expected.sampler, expected.batch_size or 1
    if expected.batch_sampler or (offset == 0 and world_size == expected.world_size):
        try:
            samples = sampler_length(sampler, length)
        except TypeError:  # a sampler without len(): its epoch's end is unknown
            return None
        if expected.batch_sampler:
            return samples
    else:
        left = length - offset
        samples = left // world_size if drop_last else -(-left // world_size)
    return batch_count(samples, batch_size, drop_last)


_UNHELD: Final = (TypeError, ValueError, RecursionError)
"""What ``json.dumps`` raises for a value JSON cannot hold: not data, an int past the digits
``int`` turns into a string, a structure nested past the recursion limit."""


def check_json(state: object) -> None:
    """Refuse a state (or list of the ranks' states) that JSON cannot hold, naming the first
    field that it cannot: every state a loader saves can, and the checks after this one show
    values in their messages, which such a value would break.

    Raises:
        ValueError: The state, or one of its fields, cannot be held as JSON.
    """
    try:
        json.dumps(state)
    except _UNHELD as error:
        states = state if isinstance(state, list) else [state]
        for number, one in enumerate(states):
            where = f"state {number} " if isinstance(state, list) else "state "
            for key, value in one.items() if isinstance(one, dict) else ():
                try:
                    json.dumps(value)
                except _UNHELD as failed:
                    raise ValueError(
                        f"{where}{str(key)[:60]} cannot be held as JSON: {str(failed)[:100]}"
                    ) from None
        raise ValueError(f"a loader state must be JSON-serialisable: {str(error)[:100]}") from None


def check_layout(
    state: dict[str, Any], required: Sequence[str], optional: Sequence[str] = ()
) -> tuple[int, int, int, int]:
    """Check the fields every loader state has (a map-style loader's or a stream's).

    Returns:
        The state's ``epoch``, ``batches_received``, ``seed`` and ``world_size``.

    Raises:
        ValueError: A field is missing or unknown, the format is another, or a position
            field is of the wrong type or range; the message names it.
    """
    for key in required:
        if key not in state:
            raise ValueError(f"state has no {key!r}")
    unknown = sorted(str(key) for key in state if key not in (*required, *optional))
    if unknown:
        raise ValueError(f"state has unknown fields {unknown}")
    if state["format"] != FORMAT or isinstance(state["format"], bool):
        raise ValueError(f"state format {state['format']!r} differs from {FORMAT}")
    epoch = _field(state, "epoch", 0)
    batches = _field(state, "batches_received", 0)
    seed = _field(state, "seed", 0)
    world_size = _field(state, "world_size", 1)
    rank = _field(state, "rank", 0)
    if rank >= world_size:
        raise ValueError(f"state rank {rank} must be below its world_size {world_size}")
    return epoch, batches, seed, world_size


def check_one_moment(states: Sequence[dict[str, Any]], keys: Iterable[str]) -> None:
    """Check that the ranks' ``states`` agree in every one of ``keys``.

    Raises:
        ValueError: They differ in one; the message names the first such key.
    """
    first = states[0]
    for key in keys:
        if any(state[key] != first[key] for state in states[1:]):
            raise ValueError(f"the states of the ranks differ in {key}")


def check_state(state: object, expected: Expected) -> tuple[Resume, bytes | None]:
    """Check a whole state against this loader, changing nothing.

    Returns:
        Where to resume, and a generator state to restore into the sampler (or ``None``).

    Raises:
        ValueError: A field is missing, unknown, of the wrong type or range, or disagrees with
            this loader; the message names it.
    """
    if not isinstance(state, dict):
        raise ValueError(f"a loader state is a dict, got {type(state).__name__}")
    if "kind" in state:
        raise ValueError(
            f"state kind {state['kind']!r}: the state is a stream loader's, and this loader "
            "reads a map-style dataset"
        )
    epoch, batches, seed, world_size = check_layout(state, _REQUIRED, _OPTIONAL)
    offset = _field(state, "offset", 0, default=0)
    for key in ("dataset_length", "batch_size", "drop_last"):
        ours = getattr(expected, key)
        if state[key] != ours or type(state[key]) is not type(ours):
            raise ValueError(f"state {key} {state[key]!r} differs from this loader's {ours!r}")
    sampler = expected.sampler
    if expected.adopts_seed:
        if expected.default_sampler is not None:
            sampler = expected.default_sampler(seed)
    elif seed != expected.seed:
        raise ValueError(f"state seed {seed} differs from this loader's seed {expected.seed}")
    generator = _check_sampler(state["sampler"], capture_shape(sampler), sampler)
    elastic = offset > 0 or world_size != expected.world_size
    if elastic and order_of(sampler) is None:
        raise ValueError(
            f"state world_size {world_size} and offset {offset}: a state saved by another "
            f"number of ranks (or in an elastic epoch) needs a built-in sampler, not "
            f"{type(sampler).__name__}"
        )
    if offset > expected.dataset_length:
        raise ValueError(f"state offset {offset} is past the dataset's {expected.dataset_length}")
    bound = _batches_in_epoch(expected, world_size, offset)
    if bound is not None and batches > bound:
        raise ValueError(
            f"state batches_received {batches} is past the end of its epoch: {bound} batches "
            f"of each of world_size {world_size} ranks after offset {offset}"
        )
    try:
        copy = json.loads(json.dumps(state))
    except (TypeError, ValueError) as error:
        raise ValueError(f"a loader state must be JSON-serialisable: {error}") from None
    return Resume(epoch, batches, world_size, offset, copy), generator


def capture_shape(sampler: object) -> dict[str, Any]:
    """:func:`capture_sampler` without reading a custom sampler's or a generator's state."""
    if isinstance(sampler, Sampler) or not (
        callable(getattr(sampler, "state_dict", None)) or _generator(sampler) is not None
    ):
        return capture_sampler(sampler)
    return {"kind": "custom" if callable(getattr(sampler, "state_dict", None)) else "iterable"}


def restore_sampler(sampler: object, saved: dict[str, Any], generator: bytes | None) -> None:
    """Put a checked state's sampler record back into the sampler.

    Raises:
        ValueError: The custom sampler's ``load_state_dict`` refused its state.
    """
    if saved.get("kind") == "custom":
        try:
            sampler.load_state_dict(saved["state"])  # type: ignore[attr-defined]
        except Exception as error:
            raise ValueError(
                f"state sampler: {type(sampler).__name__}.load_state_dict refused it: {error}"
            ) from error
    if generator is not None:
        import torch

        _generator(sampler).set_state(torch.frombuffer(bytearray(generator), dtype=torch.uint8))


def unrestorable_reason(sampler: object) -> str | None:
    """Why the sampler's order cannot be restored, if it cannot (``None`` when it can)."""
    if _draws_from_torchs_global_generator(sampler):
        return (
            f"{type(sampler).__name__} has no generator: it draws each epoch's order from "
            "torch's global random state, which a loader state does not hold, so a resumed "
            "epoch may not be in the saved order; pass generator=torch.Generator().manual_seed(s)"
        )
    return None


def write_state(
    expected: Expected,
    rank: int,
    epoch: int,
    received: int,
    offset: int,
    sampler: dict[str, Any],
) -> dict[str, Any]:
    """A state in the layout :func:`check_state` reads."""
    state: dict[str, Any] = {
        "format": FORMAT,
        "epoch": epoch,
        "batches_received": received,
        "seed": expected.seed,
        "dataset_length": expected.dataset_length,
        "batch_size": expected.batch_size,
        "drop_last": expected.drop_last,
        "world_size": expected.world_size,
        "rank": rank,
        "sampler": sampler,
    }
    if offset:
        state["offset"] = offset
    return state


def shared_order(sampler: object, length: int, epoch: int) -> Sequence[int]:
    """The epoch's order before sharding, that every rank shares (a built-in sampler)."""
    if isinstance(sampler, DistributedSampler):
        return sampler.global_order(length, epoch)
    return read_sampler(sampler, length, epoch)


def elastic_indices(
    order: Sequence[int], consumed: int, world_size: int, rank: int, drop_last: bool
) -> list[int]:
    """This rank's share of the positions of ``order`` after the ``consumed`` first."""
    return shard(order[consumed:], world_size, rank, drop_last)
