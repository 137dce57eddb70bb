"""Samplers: the indices of one epoch, and how they are cut into batches.

The built-in samplers are functions of ``(dataset length, epoch)``, so an epoch's order can be
recomputed from two numbers. Any other finite iterable of ``int`` works too: it is read whole at
the start of each epoch (after ``set_epoch(epoch)`` when it has one, as torch's
``DistributedSampler`` expects, unless its user set the epoch: :class:`EpochFollower`).
"""

from __future__ import annotations

import operator
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, overload

import numpy as np

from ._settings import check_int


class Sampler:
    """Base class of the built-in samplers: the indices of an epoch, from its number."""

    epoch: int | None = None
    """The epoch last given to :meth:`set_epoch` (``None`` before any call)."""

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the one the loader runs next, as torch's ``DistributedSampler``
        takes it: a training loop that calls it before each epoch (Lightning's ``Trainer``
        does, on every loader's sampler) numbers the loader's epochs as its own, and a
        loaded state of another epoch is then left unused."""
        self.epoch = check_int("epoch", epoch, 0)

    def indices(self, length: int, epoch: int) -> Sequence[int]:
        """Return the indices of epoch ``epoch`` over a dataset of ``length`` items."""
        raise NotImplementedError

    def num_samples(self, length: int) -> int:
        """The number of indices :meth:`indices` returns for a dataset of ``length`` items."""
        return length


class SequentialSampler(Sampler):
    """``0, 1, …, length - 1`` every epoch."""

    def indices(self, length: int, epoch: int) -> Sequence[int]:
        """Return ``range(length)``; the epoch does not matter."""
        return range(length)

    def __repr__(self) -> str:
        return "SequentialSampler()"


class RandomSampler(Sampler):
    """A permutation of the dataset that depends only on ``(seed, epoch)``.

    Args:
        seed: The non-negative seed. Each epoch draws a new permutation from
            ``numpy.random.default_rng([seed, epoch])``, so any epoch can be recomputed.
    """

    def __init__(self, seed: int) -> None:
        self.seed = check_int("seed", seed, 0)

    def indices(self, length: int, epoch: int) -> Sequence[int]:
        """Return the permutation of ``range(length)`` for ``epoch``."""
        return Permutation(length, self.seed, epoch)

    def __repr__(self) -> str:
        return f"RandomSampler(seed={self.seed})"


class Permutation(Sequence[int]):
    """The permutation of ``range(length)`` drawn from ``(seed, epoch)``, kept as one int64
    array: a slice is a list of ``int``, made when a batch is cut. A list of the whole epoch
    would cost 4 ms per 200,000 items before the first batch, and a Python int per item."""

    __slots__ = ("_order",)

    def __init__(self, length: int, seed: int, epoch: int) -> None:
        self._order = np.random.default_rng([seed, epoch]).permutation(length)

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> list[int]: ...

    def __getitem__(self, key: int | slice) -> int | list[int]:
        picked: int | list[int] = self._order[key].tolist()
        return picked

    def __iter__(self) -> Iterator[int]:
        return iter(self._order.tolist())


def _permutation(length: int, seed: int, epoch: int) -> list[int]:
    return Permutation(length, seed, epoch)[:]


def shard(indices: Sequence[int], num_replicas: int, rank: int, drop_last: bool) -> list[int]:
    """``rank``'s share of ``indices``, as torch's ``DistributedSampler`` takes it.

    Without ``drop_last`` the list is padded with its own first indices (repeated if need be)
    to a multiple of ``num_replicas``; with it, the tail is dropped. Rank ``r`` then takes
    positions ``r, r + num_replicas, r + 2 * num_replicas, ...``.
    """
    total = len(indices)
    per_rank = total // num_replicas if drop_last else -(-total // num_replicas)
    size = per_rank * num_replicas
    padded = list(indices)
    if size > total and total:
        padding = size - total
        padded += (padded * (padding // total + 1))[:padding]
    return padded[:size][rank:size:num_replicas]


class DistributedSampler(Sampler):
    """One rank's share of each epoch, as torch's ``DistributedSampler`` defines it.

    Every rank draws the same permutation from ``(seed, epoch)`` (or keeps the order without
    ``shuffle``) and takes a disjoint share: positions ``rank, rank + num_replicas, ...``.
    Without ``drop_last`` the epoch is padded with its first indices so every rank gets the
    same number; with it, the tail that does not divide evenly is dropped.

    Args:
        num_replicas: The number of ranks (``world_size``).
        rank: This rank, from 0 to ``num_replicas - 1``.
        shuffle: Permute each epoch.
        seed: The seed every rank shares.
        drop_last: Drop the tail instead of padding.
    """

    def __init__(
        self,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        self.num_replicas = check_int("num_replicas", num_replicas, 1)
        self.rank = check_int("rank", rank, 0)
        if rank >= num_replicas:
            raise ValueError(f"rank must be below num_replicas={num_replicas}, got {rank}")
        self.shuffle = shuffle
        self.seed = check_int("seed", seed, 0)
        self.drop_last = drop_last

    def global_order(self, length: int, epoch: int) -> list[int]:
        """The order of the whole epoch that every rank shares (before sharding)."""
        return _permutation(length, self.seed, epoch) if self.shuffle else list(range(length))

    def indices(self, length: int, epoch: int) -> Sequence[int]:
        """This rank's share of epoch ``epoch``."""
        order = self.global_order(length, epoch)
        return shard(order, self.num_replicas, self.rank, self.drop_last)

    def num_samples(self, length: int) -> int:
        """The indices each rank gets per epoch."""
        if self.drop_last:
            return length // self.num_replicas
        return -(-length // self.num_replicas)

    def __repr__(self) -> str:
        return (
            f"DistributedSampler(num_replicas={self.num_replicas}, rank={self.rank}, "
            f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last})"
        )


SLOW_READ_S: Final = 10.0
"""How long reading an epoch's sampler may take before a warning says so: one that never ends
(an infinite sampler, for training by steps, which torch reads as the batches go) would
otherwise leave the loader silent for ever, its memory growing."""


class _ReadWatch:
    """Warns, once, when reading ``what`` (``sampler``, which yields ``unit``) has taken
    :data:`SLOW_READ_S`."""

    def __init__(self, what: str, sampler: object, unit: str) -> None:
        self.what, self.name, self.unit = what, type(sampler).__name__, unit
        self.started = time.monotonic()
        self.said = False

    def check(self, count: int) -> None:
        elapsed = time.monotonic() - self.started
        if self.said or elapsed < SLOW_READ_S:
            return
        self.said = True
        warnings.warn(
            f"the {self.what} ({self.name}) has yielded {count:,} {self.unit} in "
            f"{elapsed:.0f} s and goes on: the loader reads an epoch's {self.what} whole before "
            "its first batch, so one that never ends (an infinite sampler, for training by "
            "steps) never lets the epoch start; give it one epoch's indices and run the epochs "
            "one after another (Ctrl-C stops the reading; under asyncio.run, whose first "
            "Ctrl-C waits for the loop, a second one)",
            stacklevel=_outside(),
        )


def _outside() -> int:
    """The ``stacklevel`` of the first frame outside this package, for a warning issued by
    this function's caller."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def read_sampler(sampler: object, length: int, epoch: int) -> Sequence[int]:
    """Read the indices of one epoch from ``sampler``, checking that each is an ``int``.

    A built-in sampler's indices are kept as they come (a ``range``, a :class:`Permutation`):
    a list of 200,000 indices took 4 ms to build before the first batch.

    Raises:
        TypeError: The sampler yields something that is not an integer.
    """
    if isinstance(sampler, Sampler):
        drawn = sampler.indices(length, epoch)
        return drawn if isinstance(drawn, range | list | Permutation) else list(drawn)
    assert isinstance(sampler, Iterable)
    indices: list[int] = []
    watch = _ReadWatch("sampler", sampler, "indices")
    for position, value in enumerate(sampler):
        indices.append(_index(value, "sampler", position))
        if not position & 0xFFFF:
            watch.check(position)
    return indices


def _index(value: Any, what: str, position: int) -> int:
    try:
        if isinstance(value, bool):  # a mask's, not an index (NumPy's bools have no index)
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{what} yielded {value!r} ({type(value).__name__}) at position {position}; "
            "indices must be integers"
        ) from None


def read_batch_sampler(batch_sampler: Iterable[object]) -> ListedBatches:
    """Read one epoch of ``batch_sampler`` (lists of indices), checking each index."""
    batches: list[list[int]] = []
    watch = _ReadWatch("batch_sampler", batch_sampler, "batches")
    for number, batch in enumerate(batch_sampler):
        if not number & 0x3FF:
            watch.check(number)
        if isinstance(batch, str | bytes) or not isinstance(batch, Iterable):
            raise TypeError(
                f"batch_sampler yielded {type(batch).__name__} for batch {number}; "
                "each batch must be an iterable of indices"
            )
        batches.append(
            [_index(value, f"batch_sampler batch {number}", i) for i, value in enumerate(batch)]
        )
    return ListedBatches(batches)


class EpochFollower:
    """Tells a sampler with ``set_epoch`` which epoch runs, unless its user did.

    torch's documented loop calls ``sampler.set_epoch(epoch)`` itself before each epoch: the
    epoch it set (seen in the sampler's ``epoch`` attribute, changed since the loader last
    looked) is then the one that runs, and the loader's epoch follows it. Otherwise the
    loader calls ``set_epoch`` with its own epoch number.
    """

    def __init__(self, sampler: object) -> None:
        self._target: Any = next(
            (s for s in (sampler, getattr(sampler, "sampler", None)) if _has_set_epoch(s)), None
        )
        self._seen = getattr(self._target, "epoch", None)

    def epoch(self, epoch: int) -> int:
        """The epoch that runs next, given the loader's; sets it on the sampler if need be."""
        target = self._target
        if target is None:
            return epoch
        current = getattr(target, "epoch", None)
        if isinstance(current, int) and current != self._seen and current >= 0:
            self._seen = current
            return current  # the user's set_epoch
        target.set_epoch(epoch)
        self._seen = getattr(target, "epoch", None)
        return epoch

    def changed(self) -> bool:
        """Whether the sampler's user set an epoch since the loader last looked."""
        current = getattr(self._target, "epoch", None)
        return isinstance(current, int) and current != self._seen and current >= 0


def _has_set_epoch(sampler: object) -> bool:
    return sampler is not None and callable(getattr(sampler, "set_epoch", None))


def sampler_length(sampler: object, length: int) -> int:
    """The number of indices one epoch of ``sampler`` yields, without reading it.

    Raises:
        TypeError: The sampler has no ``__len__`` (as in PyTorch).
    """
    if isinstance(sampler, Sampler):
        return sampler.num_samples(length)
    if not hasattr(sampler, "__len__"):
        raise TypeError(f"{type(sampler).__name__} sampler has no len(), so the loader has none")
    return len(sampler)


class Batches(Sequence[list[int]]):
    """Batches of an epoch's indices, each cut when it is asked for (see :func:`cut_batches`).

    Cutting 200,000 indices into lists up front took 5 ms before the first batch, and kept a
    list per batch for the whole epoch; the driver asks for a batch when it starts it.

    Args:
        indices: The epoch's indices.
        batch_size: Indices per batch.
        stop: How many of ``indices`` are cut (all but a dropped short last batch).
        numbers: The epoch's batch numbers these batches are (a resumed epoch skips some).
    """

    __slots__ = ("_batch_size", "_indices", "_numbers", "_stop")

    def __init__(self, indices: Sequence[int], batch_size: int, stop: int, numbers: range) -> None:
        self._indices = indices
        self._batch_size = batch_size
        self._stop = stop
        self._numbers = numbers

    def __len__(self) -> int:
        return len(self._numbers)

    @overload
    def __getitem__(self, key: int) -> list[int]: ...

    @overload
    def __getitem__(self, key: slice) -> Batches: ...

    def __getitem__(self, key: int | slice) -> list[int] | Batches:
        if isinstance(key, slice):
            return Batches(self._indices, self._batch_size, self._stop, self._numbers[key])
        start = self._numbers[key] * self._batch_size
        chunk = self._indices[start : min(start + self._batch_size, self._stop)]
        return chunk if isinstance(chunk, list) else list(chunk)

    @property
    def largest(self) -> int:
        """The most indices a batch of these holds."""
        return min(self._batch_size, self._stop) if len(self._numbers) else 0

    @property
    def items(self) -> int:
        """The number of indices in these batches, counted without a walk over them (an
        epoch of 2**40 items has 2**38 batches of 4)."""
        size, stop, numbers = self._batch_size, self._stop, self._numbers
        if numbers.step < 0:  # not made so: counted one by one
            return sum(min(size, stop - number * size) for number in numbers)
        whole = stop // size  # the batches before it are full; it holds the rest, if any
        full = len(range(numbers.start, min(numbers.stop, whole), numbers.step))
        rest = stop - whole * size if whole in numbers else 0
        return full * size + rest


class ListedBatches(Sequence[list[int]]):
    """An epoch's batches as a ``batch_sampler`` gave them."""

    __slots__ = ("_batches",)

    def __init__(self, batches: list[list[int]]) -> None:
        self._batches = batches

    def __len__(self) -> int:
        return len(self._batches)

    @overload
    def __getitem__(self, key: int) -> list[int]: ...

    @overload
    def __getitem__(self, key: slice) -> ListedBatches: ...

    def __getitem__(self, key: int | slice) -> list[int] | ListedBatches:
        if isinstance(key, slice):
            return ListedBatches(self._batches[key])
        return self._batches[key]

    @property
    def largest(self) -> int:
        """The most indices a batch of these holds."""
        return max(map(len, self._batches), default=0)

    @property
    def items(self) -> int:
        """The number of indices in these batches."""
        return sum(len(batch) for batch in self._batches)


def cut_batches(indices: Sequence[int], batch_size: int, drop_last: bool) -> Batches:
    """Cut an epoch's indices into batches of ``batch_size``, dropping a short last one if asked."""
    stop = len(indices) - len(indices) % batch_size if drop_last else len(indices)
    return Batches(indices, batch_size, stop, range(-(-stop // batch_size)))


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """The number of batches ``samples`` indices make (PyTorch's ``len(loader)``)."""
    return samples // batch_size if drop_last else -(-samples // batch_size)
