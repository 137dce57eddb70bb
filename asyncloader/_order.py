"""What orders an epoch: the sampler (or batch sampler), the seed, the ranks; and the plan of
an epoch's batches, a loaded state's position included."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ._distributed import resolve_ranks
from ._sampler import (
    Batches,
    DistributedSampler,
    EpochFollower,
    ListedBatches,
    RandomSampler,
    Sampler,
    SequentialSampler,
    cut_batches,
    read_batch_sampler,
    read_sampler,
)
from ._settings import check_bool, check_int
from ._state import Expected, Resume, capture_sampler, elastic_indices, shared_order

logger = logging.getLogger("asyncloader")


def _seed_from(generator: Any) -> int:
    """A seed drawn from a ``torch.Generator`` (torch's way of seeding a loader's shuffle)."""
    import torch

    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return int(torch.randint(0, 2**62, (), generator=generator))


def check_batch_sampler(
    batch_sampler: object, batch_size: object, shuffle: object, sampler: object, drop_last: object
) -> object:
    """``batch_sampler`` if it may be used with the other settings (torch's rule)."""
    if batch_sampler is None:
        return None
    if batch_size != 1 or shuffle or sampler is not None or drop_last:
        raise ValueError(
            "batch_sampler is exclusive with batch_size, shuffle, sampler and drop_last "
            "(as in torch): the batch sampler makes the batches"
        )
    if isinstance(batch_sampler, str | bytes) or not hasattr(batch_sampler, "__iter__"):
        raise TypeError(f"batch_sampler must be an iterable of index lists, got {batch_sampler!r}")
    return batch_sampler


@dataclass
class Plan:
    """An epoch's batches, and where its consumer starts in them."""

    epoch: int
    batches: Batches | ListedBatches
    skip: int
    offset: int
    sampler: dict[str, Any]


class Order:
    """The sampler, batch sampler, seed and ranks of one loader, validated when it is built.

    Args:
        shuffle, sampler, batch_sampler, seed, generator, rank, world_size, drop_last: The
            loader's settings of those names.
    """

    def __init__(
        self,
        *,
        shuffle: object,
        sampler: object,
        batch_sampler: object,
        seed: object,
        generator: Any,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
    ) -> None:
        self.shuffle = False if shuffle is None else check_bool("shuffle", shuffle)
        self.drop_last = drop_last
        self.batch_sampler = batch_sampler
        if generator is not None:
            if seed is not None:
                raise ValueError("seed and generator are exclusive; pass one of them")
            seed = _seed_from(generator)
        self.seed_given = seed is not None
        self._asked = rank, world_size
        self.rank, self.world_size = resolve_ranks(rank, world_size)
        if seed is not None:
            self.seed: int = check_int("seed", seed, 0)
        elif self.world_size > 1:
            # Every rank is a process of its own: a seed drawn from each one's OS would give
            # each its own permutation and overlapping shares. 0, as torch's DistributedSampler.
            self.seed = 0
        else:
            self.seed = secrets.randbits(63)
        self.seed_drawn = not self.seed_given and self.world_size == 1
        """Whether the seed was drawn from the OS (which more than one rank makes 0)."""
        self.owns_sampler = sampler is None and batch_sampler is None
        if sampler is not None:
            if self.shuffle:
                raise ValueError("sampler and shuffle=True are exclusive; pass one of them")
            if not isinstance(sampler, Sampler) and not hasattr(sampler, "__iter__"):
                raise TypeError(f"sampler must be an iterable of int, got {sampler!r}")
            self.sampler: object = sampler
        else:
            self.sampler = self.default_sampler(self.seed)
        self._follower = EpochFollower(self.source)

    def follow_ranks(self) -> None:
        """Read again the ranks left to ``torch.distributed`` or the environment.

        A loader may be built before its process group starts: Lightning's ``Trainer``
        starts it inside ``fit``, and the processes it starts have no ``RANK``. What changed
        orders the epochs from the next one: a seed drawn from the OS becomes 0 with more
        than one rank (every rank must draw the same order), and the loader's own sampler
        becomes this rank's share.
        """
        rank, world_size = self._asked
        if rank is not None and world_size is not None:
            return
        ranks = resolve_ranks(rank, world_size)
        if ranks == (self.rank, self.world_size):
            return
        self.rank, self.world_size = ranks
        if self.world_size > 1 and self.seed_drawn:
            self.seed, self.seed_drawn = 0, False
        if self.owns_sampler:
            self.sampler = self.default_sampler(self.seed)
            self._follower = EpochFollower(self.source)

    def default_sampler(self, seed: int) -> Sampler:
        """The loader's own sampler for ``seed``: its rank's share, or the whole epoch."""
        if self.world_size > 1:
            return DistributedSampler(
                self.world_size, self.rank, self.shuffle, seed=seed, drop_last=self.drop_last
            )
        return RandomSampler(seed) if self.shuffle else SequentialSampler()

    @property
    def source(self) -> object:
        """What orders an epoch: the batch sampler when there is one, else the sampler."""
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def adopt_seed(self, seed: int, drawn: bool = False) -> None:
        """Take a loaded state's seed, or a copied loader's (``drawn``: the OS drew it), in
        place of one drawn from the OS."""
        if drawn and self.world_size > 1:
            return  # 0, as a seed drawn here would have become: every rank's must agree
        self.seed, self.seed_drawn = seed, drawn
        if self.owns_sampler:
            self.sampler = self.default_sampler(seed)

    def expected(self, length: int, batch_size: int | None) -> Expected:
        """What a loaded state must agree with."""
        return Expected(
            dataset_length=length,
            batch_size=batch_size,
            drop_last=self.drop_last,
            seed=self.seed,
            adopts_seed=not self.seed_given,
            sampler=self.source,
            batch_sampler=self.batch_sampler is not None,
            world_size=self.world_size,
            default_sampler=self.default_sampler if self.owns_sampler else None,
        )

    def run_epoch(self, epoch: int) -> int:
        """The epoch that runs next, given the loader's: the one its sampler's user set
        (``sampler.set_epoch``), if they did since the loader last looked."""
        return self._follower.epoch(epoch)

    def epoch_changed(self) -> bool:
        """Whether the sampler's user set an epoch since the last one was planned."""
        return self._follower.changed()

    def plan(self, epoch: int, resume: Resume | None, length: int, batch_size: int) -> Plan:
        """Read the sampler for the epoch that runs next (the user's ``set_epoch`` wins), and
        where a loaded state puts its consumer: the batches received are skipped, or, for a
        state of another number of ranks (or of an elastic epoch), this rank's share of what
        no rank received."""
        epoch = self.run_epoch(epoch)
        if resume is not None and resume.epoch != epoch:
            resume = None
        skip = resume.batches if resume is not None else 0
        offset = 0
        recorded = capture_sampler(self.source)
        if self.batch_sampler is not None:
            assert isinstance(self.batch_sampler, Iterable)
            listed = read_batch_sampler(self.batch_sampler)
            _warn_if_used_up("batch_sampler", self.batch_sampler, len(listed), epoch)
            return Plan(epoch, listed, skip, 0, recorded)
        if resume is not None and (resume.world_size != self.world_size or resume.offset):
            order = shared_order(self.sampler, length, resume.epoch)
            offset = resume.offset
            if resume.world_size != self.world_size:
                offset, skip = offset + resume.world_size * resume.batches * batch_size, 0
            indices = elastic_indices(order, offset, self.world_size, self.rank, self.drop_last)
        else:
            indices = read_sampler(self.sampler, length, epoch)  # type: ignore[assignment]
            _warn_if_used_up("sampler", self.sampler, len(indices), epoch)
        return Plan(epoch, cut_batches(indices, batch_size, self.drop_last), skip, offset, recorded)


def _warn_if_used_up(name: str, source: object, count: int, epoch: int) -> None:
    """Say so when an epoch after the first finds a sampler that is an iterator empty: an
    earlier epoch used it up, and every epoch from now on would pass with no batch, silently
    (as torch's do)."""
    if count == 0 and epoch > 0 and isinstance(source, Iterator):
        logger.warning(
            "%s is an iterator (%s) that an earlier epoch used up: epoch %d has no batch; "
            "pass a list, or an object whose __iter__ starts again",
            name,
            type(source).__name__,
            epoch,
        )
