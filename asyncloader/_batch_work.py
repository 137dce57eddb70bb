"""A batch's CPU work, wherever it runs (a CPU thread, the direct path, a worker process):
its transforms, the items ``errors="skip"`` drops, its collation, and a sync dataset's fetch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ._skip import SKIPPED, Skipper
from ._source import fetch_batch, fetch_item
from ._stats import Recorder
from ._transform import Transform

Batch = tuple[list[int], Any]
"""A finished batch with the indices of its items."""


def transform_items(
    indices: Sequence[int],
    items: list[Any],
    transform: Transform | None,
    recorder: Recorder,
    skipper: Skipper | None,
) -> tuple[list[int], list[Any]]:
    """Transform a batch's items, dropping the ones ``skipper`` lets go; keep their indices."""
    kept = list(indices)
    if transform is not None:
        durations = []
        out = []
        clock = time.perf_counter
        cpu_started = time.thread_time()
        for index, item in zip(indices, items, strict=True):
            if item is not SKIPPED:
                started = clock()
                try:
                    item = transform(index, item)
                except Exception as error:
                    if skipper is None:
                        raise
                    skipper.skip(index, error)
                    item = SKIPPED
                durations.append(clock() - started)
            out.append(item)
        items = out
        recorder.add_many("transform", durations)
        recorder.add_transform_cpu(time.thread_time() - cpu_started)
    if skipper is not None:
        kept = [index for index, item in zip(indices, items, strict=True) if item is not SKIPPED]
        items = [item for item in items if item is not SKIPPED]
    return kept, items


def transform_and_collate(
    indices: Sequence[int],
    items: list[Any],
    transform: Transform | None,
    collate: Callable[[list[Any]], Any],
    recorder: Recorder,
    skipper: Skipper | None,
) -> Batch:
    """Transform a batch's items (dropping the ones ``skipper`` lets go), then collate them:
    one CPU job of a batch task."""
    kept, items = transform_items(indices, items, transform, recorder, skipper)
    started = time.perf_counter()
    batch = collate_or_pass(items, collate, skipper)
    recorder.add("collate", time.perf_counter() - started)
    return kept, batch


def collate_or_pass(
    items: list[Any], collate: Callable[[list[Any]], Any], skipper: Skipper | None
) -> Any:
    """The batch of ``items``; :data:`SKIPPED` when ``errors="skip"`` dropped every one of
    them: such a batch is passed over, not delivered (an empty one is no batch to train on,
    and a ``collate_fn`` such as torch's refuses it)."""
    if not items and skipper is not None:
        return SKIPPED
    return collate(items)


def passed_over(value: object) -> bool:
    """Whether a finished batch is one whose every item was skipped."""
    return isinstance(value, tuple) and value[1] is SKIPPED


def fetch_or_skip(dataset: Any, indices: list[int], skipper: Skipper | None) -> list[Any]:
    """Fetch a batch from a sync dataset; under ``errors="skip"``, drop the failing items."""
    try:
        return fetch_batch(dataset, indices)
    except Exception:
        if skipper is None:
            raise
    items: list[Any] = []
    for index in indices:  # find the failing items one by one
        try:
            items.append(fetch_item(dataset, index))
        except Exception as error:
            skipper.skip(index, error)
            items.append(SKIPPED)
    return items
