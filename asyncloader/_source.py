"""The dataset as the driver sees it: a sync or an async source of items.

A dataset is recognised by its methods: ``async def __getitem__``/``__getitems__`` make an
async dataset, plain ones a sync dataset (any torch map-style dataset). Mixing the two, or
lacking ``__len__`` or ``__getitem__``, is refused when the loader is built. (A stream, read by
iterating, is recognised first: :mod:`._stream`.)
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

from ._pool import ThreadPool


def is_async_dataset(dataset: object) -> bool:
    """Whether ``dataset`` is an async dataset.

    Raises:
        TypeError: It lacks ``__len__`` or ``__getitem__``, or mixes sync and async methods.
    """
    kind = type(dataset).__name__
    if not hasattr(dataset, "__len__"):
        raise TypeError(f"dataset {kind} has no __len__; map-style datasets need one")
    if not hasattr(dataset, "__getitem__"):
        raise TypeError(f"dataset {kind} has no __getitem__")
    methods = {
        name: inspect.iscoroutinefunction(getattr(dataset, name))
        for name in ("__getitem__", "__getitems__")
        if hasattr(dataset, name)
    }
    if len(set(methods.values())) > 1:
        described = ", ".join(
            f"{name} is {'async' if a else 'sync'}" for name, a in methods.items()
        )
        raise TypeError(f"dataset {kind} mixes sync and async item methods ({described})")
    return methods["__getitem__"]


def _refuse_awaitables(items: Sequence[object], method: str, dataset: object) -> NoReturn:
    """Refuse a sync dataset whose ``method`` returned an awaitable (``items[0]``), closing
    each coroutine among ``items`` (so that none warns "coroutine ... was never awaited")."""
    for item in items:
        if inspect.iscoroutine(item):
            item.close()
    kind = type(dataset).__name__
    if hasattr(dataset, "dataset") or hasattr(dataset, "datasets"):  # torch's Subset, Concat...
        raise TypeError(
            f"{kind} wraps an async dataset and returns its items unawaited "
            f"({type(items[0]).__name__}); give the loader the async dataset itself (for a "
            "subset, with its indices as sampler=)"
        )
    raise TypeError(
        f"{kind}.{method} returned an awaitable ({type(items[0]).__name__}); define it with "
        "'async def' to make an async dataset"
    )


def listed(items: object, indices: Sequence[int], dataset: object) -> list[Any]:
    """What ``__getitems__`` returned, as a list of one item per index: any iterable of the
    items (a list, a tuple, the rows of an array, a generator).

    Raises:
        TypeError: It returned something that is not a sequence of items: ``None``, a
            mapping, a string.
        ValueError: It returned another number of items than of indices.
    """
    if items is None or isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise TypeError(
            f"{type(dataset).__name__}.__getitems__ returned {type(items).__name__}; it must "
            "return one item per index, in a list (or any iterable of them)"
        )
    result = list(items)
    check_count(result, indices)
    return result


def check_count(items: Sequence[Any], indices: Sequence[int]) -> None:
    """Fail a batch whose ``__getitems__`` returned the wrong number of items."""
    if len(items) != len(indices):
        raise ValueError(
            f"__getitems__ returned {len(items)} items for {len(indices)} indices; "
            "it must return exactly one item per index"
        )


def fetch_batch(dataset: Any, indices: Sequence[int]) -> list[Any]:
    """Fetch a whole batch from a sync dataset on the calling thread.

    One ``__getitems__(indices)`` call when the dataset has it, else ``__getitem__`` per index.
    """
    getitems = getattr(dataset, "__getitems__", None)
    if getitems is not None:
        returned = getitems(list(indices))
        if inspect.isawaitable(returned):
            _refuse_awaitables([returned], "__getitems__", dataset)
        items = listed(returned, indices, dataset)
        if items and inspect.isawaitable(items[0]):
            _refuse_awaitables(items, "__getitems__ item", dataset)
        return items
    getitem = dataset.__getitem__
    result: list[Any] = []
    for index in indices:
        item = getitem(index)
        # One check per batch, as the reference: the first item tells.
        if not result and inspect.isawaitable(item):
            _refuse_awaitables([item], "__getitem__", dataset)
        result.append(item)
    return result


def fetch_item(dataset: Any, index: int) -> Any:
    """Fetch one item from a sync dataset on the calling thread."""
    item = dataset.__getitem__(index)
    if inspect.isawaitable(item):
        _refuse_awaitables([item], "__getitem__", dataset)
    return item


class Source:
    """Async access to a dataset's items for the driver.

    Args:
        dataset: The dataset.
        io: The pool that runs a sync dataset's calls (``None`` for an async dataset).
    """

    def __init__(self, dataset: Any, io: ThreadPool | None) -> None:
        self.dataset = dataset
        self.io = io
        self.fetches_whole_batches = io is not None or hasattr(dataset, "__getitems__")
        """Whether one call fetches a batch (so ``item_concurrency == 1`` makes one call)."""
        self.get: Callable[[int], Awaitable[Any]] = (
            # An async dataset's own method: no coroutine of ours around each item.
            dataset.__getitem__ if io is None else self._get_on_pool
        )
        """One item."""

    async def get_batch(self, indices: Sequence[int]) -> list[Any]:
        """All the items of a batch, in one call (requires :attr:`fetches_whole_batches`)."""
        if self.io is not None:
            return await self.io.run(fetch_batch, self.dataset, indices)
        return listed(await self.dataset.__getitems__(list(indices)), indices, self.dataset)

    async def _get_on_pool(self, index: int) -> Any:
        assert self.io is not None
        return await self.io.run(fetch_item, self.dataset, index)
