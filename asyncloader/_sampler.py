"""Samplers: the indices of one epoch, and how they are cut into batches.

The built-in samplers are functions of ``(dataset length, epoch)``, so an epoch's order can be
recomputed from two numbers. Any other finite iterable of ``int`` works too: it is read whole at
the start of each epoch (after ``set_epoch(epoch)`` when it has one, as torch's
``DistributedSampler`` expects).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

import numpy as np

from ._settings import check_int


class Sampler:
    """Base class of the built-in samplers: the indices of an epoch, from its number."""

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
        rng = np.random.default_rng([self.seed, epoch])
        result: list[int] = rng.permutation(length).tolist()
        return result

    def __repr__(self) -> str:
        return f"RandomSampler(seed={self.seed})"


def read_sampler(sampler: object, length: int, epoch: int) -> list[int]:
    """Read the indices of one epoch from ``sampler``, checking that each is an ``int``.

    Raises:
        TypeError: The sampler yields something that is not an integer.
    """
    if isinstance(sampler, Sampler):
        return list(sampler.indices(length, epoch))
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
    assert isinstance(sampler, Iterable)
    indices: list[int] = []
    for position, value in enumerate(sampler):
        try:
            indices.append(operator.index(value))
        except TypeError:
            raise TypeError(
                f"sampler yielded {value!r} ({type(value).__name__}) at position {position}; "
                "indices must be integers"
            ) from None
    return indices


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


def cut_batches(indices: Sequence[int], batch_size: int, drop_last: bool) -> list[list[int]]:
    """Cut an epoch's indices into batches of ``batch_size``, dropping a short last one if asked."""
    stop = len(indices) - len(indices) % batch_size if drop_last else len(indices)
    return [list(indices[start : start + batch_size]) for start in range(0, stop, batch_size)]


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """The number of batches ``samples`` indices make (PyTorch's ``len(loader)``)."""
    return samples // batch_size if drop_last else -(-samples // batch_size)
