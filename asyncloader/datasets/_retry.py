"""``Retry``: when to try a failed fetch again, and how long to wait first.

Each dataset classifies its own failures: an attempt raises :class:`AttemptFailed` carrying
the exception the caller will see, whether the failure is transient, and the server's
``Retry-After``. Only transient failures are retried, at most ``max_retries`` times, after an
exponential backoff whose second half is random jitter. The final exception says how many
attempts were made.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .._settings import check_int
from .._stats import note_retry

T = TypeVar("T")


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"Retry: {name} must be a number of seconds, got {value!r}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"Retry: {name} must be finite and at least 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Retry:
    """How transient failures are retried.

    Args:
        max_retries: Retries after the first attempt (0: no retry).
        initial_backoff: Seconds before the first retry (the base of the exponential).
        max_backoff: The longest wait between attempts, ``Retry-After`` included.
    """

    max_retries: int = 3
    initial_backoff: float = 0.1
    max_backoff: float = 10.0

    def __post_init__(self) -> None:
        check_int("Retry: max_retries", self.max_retries, 0)
        object.__setattr__(
            self, "initial_backoff", _check_seconds("initial_backoff", self.initial_backoff)
        )
        object.__setattr__(self, "max_backoff", _check_seconds("max_backoff", self.max_backoff))
        if self.max_backoff < self.initial_backoff:
            raise ValueError(
                f"Retry: max_backoff ({self.max_backoff}) is below initial_backoff "
                f"({self.initial_backoff})"
            )

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first).

        ``Retry-After`` is honoured up to ``max_backoff``; otherwise the backoff doubles each
        retry up to ``max_backoff``, and its second half is drawn at random.
        """
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff)
        backoff = min(self.max_backoff, self.initial_backoff * 2.0**retry)
        return backoff / 2 + random.random() * backoff / 2


class AttemptFailed(Exception):
    """One failed attempt: ``error`` is what the caller sees if it is not retried."""

    def __init__(
        self, error: BaseException, transient: bool, retry_after: float | None = None
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.transient = transient
        self.retry_after = retry_after


def _final(failure: AttemptFailed, attempts: int) -> BaseException:
    """The exception to raise: the attempt's, its message ending with the attempt count."""
    error = failure.error
    noun = "attempt" if attempts == 1 else "attempts"
    if isinstance(error, OSError) and error.errno is not None:  # keep errno and filename
        return type(error)(
            error.errno, f"{error.strerror} (after {attempts} {noun})", error.filename
        )
    try:
        return type(error)(f"{error} (after {attempts} {noun})")
    except TypeError:  # an exception type whose constructor takes other arguments
        return error


async def retrying(
    retry: Retry,
    attempt: Callable[[], Awaitable[T]],
    failed: AttemptFailed | None = None,
    progress: Callable[[], int] | None = None,
) -> T:
    """Await ``attempt()`` until it succeeds, fails for good, or the retries run out;
    ``failed``: the first attempt was made by the caller, and failed so. ``progress``: how
    far the work has gone (a stream's bytes delivered); an attempt that took it further
    starts the count of attempts afresh, so that only attempts that made none run out."""
    attempts = 0 if failed is None else 1
    while True:
        if failed is None:
            attempts += 1
            before = 0 if progress is None else progress()
            try:
                return await attempt()
            except AttemptFailed as failure:
                failed = failure
                if progress is not None and progress() > before:
                    attempts = 1
        if not failed.transient or attempts > retry.max_retries:
            # `from None`: the client's own exception may hold a URL's query string.
            raise _final(failed, attempts) from None
        delay = retry.delay(attempts - 1, failed.retry_after)
        failed = None
        note_retry()
        await asyncio.sleep(delay)


def retrying_sync(retry: Retry, attempt: Callable[[], T]) -> T:
    """:func:`retrying` for blocking calls (on the loader's I/O threads)."""
    attempts = 0
    while True:
        attempts += 1
        try:
            return attempt()
        except AttemptFailed as failure:
            if not failure.transient or attempts > retry.max_retries:
                raise _final(failure, attempts) from None
            delay = retry.delay(attempts - 1, failure.retry_after)
        note_retry()
        time.sleep(delay)
