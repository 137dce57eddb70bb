"""The resume guarantee as a test (re-exported by :mod:`asyncloader.testing`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np

from ._loader import DataLoader


def _plain(batch: Any) -> Any:
    """A batch as plain Python values, so any two can be compared with ``==``."""
    if isinstance(batch, np.ndarray):
        return batch.tolist()
    if isinstance(batch, dict):
        return {key: _plain(value) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return [_plain(value) for value in batch]
    if hasattr(batch, "tolist"):  # a torch tensor
        return batch.tolist()
    return batch


def _outcomes(batches: Iterator[Any]) -> Iterator[Any]:
    """Each ``(indices, batch)`` of an epoch, or the exception its ``next()`` raised: a batch
    that fails is one of the epoch's outcomes, and the epoch goes on after it."""
    while True:
        try:
            yield next(batches)
        except StopIteration:
            return
        except Exception as error:
            yield error


async def _async_outcomes(batches: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """:func:`_outcomes` of an ``async for`` epoch."""
    while True:
        try:
            yield await anext(batches)
        except StopAsyncIteration:
            return
        except Exception as error:
            yield error


def _run(loader: DataLoader, epochs: int, mode: str) -> list[Any]:
    """``(epoch, indices, batch)`` for every batch of ``epochs`` epochs, and states after each
    (a failed batch's is ``(epoch, [], "Type: message")``).

    Returns a list of ``(record, state_after)`` pairs; the start and each epoch's end add a pair
    whose record is ``None`` (the state before the first batch, and once an epoch is over).
    """
    out: list[Any] = []

    def record(epoch: int, outcome: Any) -> None:
        if isinstance(outcome, Exception):
            outcome = ([], f"{type(outcome).__name__}: {outcome}")
        indices, batch = outcome
        out.append(((epoch, indices, _plain(batch)), loader.state_dict()))

    async def consume_async(epoch: int) -> None:
        async for outcome in _async_outcomes(loader.aiter_with_indices()):
            record(epoch, outcome)

    out.append((None, loader.state_dict()))  # before the first batch
    for _ in range(epochs):
        epoch = loader.epoch
        if mode == "async":
            asyncio.run(consume_async(epoch))
        else:
            for outcome in _outcomes(loader.iter_with_indices()):
                record(epoch, outcome)
        out.append((None, loader.state_dict()))
    return out


def assert_equal_output_after_checkpoint(
    make_loader: Callable[[], DataLoader], epochs: int = 2, mode: str = "sync"
) -> int:
    """Check exact resume from every point of ``epochs`` epochs.

    Runs ``make_loader()`` uninterrupted, saving the state after every batch and at every
    epoch's end; then, for each saved state, restores a fresh loader from it (through JSON)
    and checks that the rest of its output equals the rest of the uninterrupted run. A batch
    that fails is an outcome like any other: its error's type and message are compared, and
    the epoch goes on.

    Args:
        make_loader: Builds an identical loader each time.
        epochs: Epochs of the uninterrupted run.
        mode: ``"sync"`` (``for``) or ``"async"`` (``async for``).

    Returns:
        The number of restore points checked.

    Raises:
        AssertionError: A restored loader's output differs; the message says where.
    """
    with make_loader() as reference:
        run = _run(reference, epochs, mode)
    expected = [record for record, _ in run if record is not None]
    records_before = 0
    for point, (record, state) in enumerate(run):
        if record is not None:
            records_before += 1
        state = json.loads(json.dumps(state))
        with make_loader() as restored:
            restored.load_state_dict(state)
            remaining_epochs = epochs - state["epoch"]
            got = [] if remaining_epochs <= 0 else _run(restored, remaining_epochs, mode)
        rest = [record for record, _ in got if record is not None]
        want = expected[records_before:]
        if rest != want:
            first = next(
                (i for i, (a, b) in enumerate(zip(rest, want, strict=False)) if a != b),
                min(len(rest), len(want)),
            )
            raise AssertionError(
                f"restored from the state after output {records_before} (point {point}, "
                f"state {state}): output {first} differs or is missing: got "
                f"{rest[first] if first < len(rest) else 'nothing'}, expected "
                f"{want[first] if first < len(want) else 'nothing'}"
            )
    return len(run)
