"""A map-style loader's epochs: where each starts, and the states of its position.

The batches come from the sampler (or batch sampler), read whole at the start of each epoch;
a state counts the batches the consumer received (:mod:`._state`).
"""

from __future__ import annotations

import warnings
from typing import Any

from ._driver import EpochBatches
from ._order import Order
from ._pool import ThreadPool
from ._sampler import batch_count, sampler_length
from ._settings import Settings
from ._state import (
    Expected,
    Progress,
    Resume,
    capture_sampler,
    check_one_moment,
    check_state,
    restore_sampler,
    unrestorable_reason,
    write_state,
)

EpochStart = tuple[EpochBatches, Progress, int]
"""An epoch's batches (iterable, with ``len()``), its progress, and its number of items."""


class MapEpochs:
    """A map-style loader's epochs.

    Args:
        dataset: The dataset.
        order: The loader's sampler, seed and ranks.
        settings: The loader's settings.
        batch_size: The loader's ``batch_size`` as it reports it (``None`` unbatched).
    """

    def __init__(
        self, dataset: Any, order: Order, settings: Settings, batch_size: int | None
    ) -> None:
        self.dataset = dataset
        self._order = order
        self._settings = settings
        self._batch_size = batch_size

    def _expected(self) -> Expected:
        return self._order.expected(len(self.dataset), self._batch_size)

    def length(self) -> int:
        """The batches of an epoch (``len(loader)``).

        Raises:
            TypeError: The sampler has no ``__len__``.
        """
        order, settings = self._order, self._settings
        if order.batch_sampler is not None:
            return sampler_length(order.batch_sampler, 0)
        samples = sampler_length(order.sampler, len(self.dataset))
        return batch_count(samples, settings.batch_size, settings.drop_last)

    def state(self, progress: Progress | None, next_epoch: int) -> dict[str, Any]:
        """The position after what the consumer received (:meth:`DataLoader.state_dict`)."""
        expected, rank = self._expected(), self._order.rank
        # After the epoch's last batch it is the state between epochs, even before the
        # iterator said so: Lightning's Trainer counts an epoch's batches by len(loader), and
        # next() is never called again (torchdata's StatefulDataLoader resumes so too).
        if progress is not None and not progress.done and progress.received != progress.batches:
            epoch, received, offset = progress.epoch, progress.received, progress.offset
            return write_state(expected, rank, epoch, received, offset, progress.sampler)
        sampler = capture_sampler(self._order.source)
        return write_state(expected, rank, next_epoch, 0, 0, sampler)

    def load(self, state: object) -> Resume:
        """Check a state and restore the sampler's part of it.

        Raises:
            ValueError: The state is refused (:func:`._state.check_state`); nothing changed.
        """
        order = self._order
        # A list is every rank's state. Any one says where the epoch is, since the ranks move
        # in lockstep; each is checked, and they must be of one job's one moment.
        states = state if isinstance(state, list) else [state]
        if not states:
            raise ValueError("a list of the ranks' states needs at least one, got none")
        checked = [check_state(one, self._expected()) for one in states]
        resume, generator = checked[0]
        keys = [key for key in resume.state if key != "rank"]
        check_one_moment([other.state for other, _ in checked], keys)
        ranks = [other.state["rank"] for other, _ in checked]
        for rank in ranks:
            if ranks.count(rank) > 1:
                raise ValueError(f"the list of the ranks' states names rank {rank} twice")
        restore_sampler(order.source, resume.state["sampler"], generator)
        if not order.seed_given:
            # The seed was drawn from the OS: adopt the saved one, so the order (and the
            # augmentation) is the same.
            order.adopt_seed(resume.state["seed"])
        why = unrestorable_reason(order.source)
        if why is not None:
            warnings.warn(why, stacklevel=3)
        return resume

    def start(self, epoch: int, resume: Resume | None, io: ThreadPool) -> EpochStart:
        """The batches of the next epoch (the sampler is read whole, now), after those a
        loaded state had received: those are left out, never fetched."""
        plan = self._order.plan(epoch, resume, len(self.dataset), self._settings.batch_size)
        first = min(plan.skip, len(plan.batches))
        progress = Progress(
            plan.epoch, first, offset=plan.offset, sampler=plan.sampler, batches=len(plan.batches)
        )
        return plan.batches[plan.skip :], progress, plan.batches.items
