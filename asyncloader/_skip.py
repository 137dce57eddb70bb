"""``errors="skip"``: drop the items that fail, within a failure budget per epoch."""

from __future__ import annotations

import logging
import math
import threading
from typing import Final, Literal

from ._stats import Recorder

logger = logging.getLogger("asyncloader")


class _Skipped:
    def __reduce__(self) -> str:
        return "SKIPPED"  # the one instance, in any process

    def __repr__(self) -> str:
        return "SKIPPED"


SKIPPED: Final = _Skipped()
"""Stands for an item dropped by ``errors="skip"`` until the batch is collated."""

_LISTED = 10
"""Failures listed in the error raised when the budget is exceeded."""


class SkipBudgetExceeded(RuntimeError):
    """More items failed in an epoch than ``max_errors`` allows under ``errors="skip"``.

    Attributes:
        failures: ``(index, reason)`` of the first failures.
    """

    def __init__(self, skipped: int, budget: int, failures: list[tuple[int, str]]) -> None:
        listed = "; ".join(f"item {index}: {reason}" for index, reason in failures[:_LISTED])
        super().__init__(
            f"{skipped} items failed this epoch, over max_errors={budget}; first: {listed}"
        )
        self.failures = failures[:_LISTED]


def epoch_budget(max_errors: int | float | None, epoch_items: int) -> int | None:
    """The number of skipped items an epoch allows (``None``: no limit)."""
    if max_errors is None:
        return None
    if isinstance(max_errors, float):
        return math.floor(max_errors * epoch_items)
    return max_errors


class Skipper:
    """Counts, logs and bounds one epoch's skipped items (from any thread)."""

    def __init__(self, budget: int | None, recorder: Recorder) -> None:
        self.budget = budget
        self.recorder = recorder
        self.skipped = 0
        self.failures: list[tuple[int, str]] = []
        """The first failures, which an error over the budget lists: only they are kept, so
        an epoch that skips millions of items holds no reason for each."""
        self._lock = threading.Lock()

    def skip(self, index: int, error: BaseException) -> None:
        """Drop item ``index``; raise :class:`SkipBudgetExceeded` once over the budget."""
        reason = f"{type(error).__name__}: {error}"
        with self._lock:
            self.skipped += 1
            skipped = self.skipped
            if len(self.failures) < _LISTED:
                self.failures.append((index, reason))
            failures = list(self.failures)
        logger.warning("skipped item %d: %s", index, reason)
        self.recorder.add_skipped(1)
        if self.budget is not None and skipped > self.budget:
            raise SkipBudgetExceeded(skipped, self.budget, failures)


ErrorPolicy = Literal["raise", "skip"]
"""What a failing item does: fail its batch, or be dropped from it."""


def check_errors(errors: object, max_errors: object) -> int | float | None:
    """Validate ``errors`` and ``max_errors``; return the budget setting."""
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    if max_errors is None:
        return None
    if errors != "skip":
        raise ValueError(f"max_errors={max_errors!r} needs errors='skip'")
    if isinstance(max_errors, bool) or not isinstance(max_errors, int | float):
        raise TypeError(f"max_errors must be a count or a fraction, got {max_errors!r}")
    if isinstance(max_errors, float) and not 0.0 <= max_errors <= 1.0:
        raise ValueError(f"max_errors as a fraction must be within [0, 1], got {max_errors!r}")
    if isinstance(max_errors, int) and max_errors < 0:
        raise ValueError(f"max_errors must be at least 0, got {max_errors!r}")
    return max_errors
