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
        if progress is not None and not progress.done:
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
        if isinstance(state, list):  # every rank's state: any one says where the epoch is
            state = state[0] if state else None
        resume, generator = check_state(state, self._expected())
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
        progress = Progress(plan.epoch, first, offset=plan.offset, sampler=plan.sampler)
        return plan.batches[plan.skip :], progress, plan.batches.items
