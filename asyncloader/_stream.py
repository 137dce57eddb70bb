"""Streams: datasets read by iterating over them, not by index.

A dataset with ``__iter__`` or ``async def __aiter__`` and no ``__getitem__`` of its own (a
torch ``IterableDataset``, a generator, an async generator, an object whose ``__iter__`` is a
generator function) is a stream. An epoch of it is one pass of one iterator, read by one reader
at a time: batch ``k`` is the stream's items ``k * batch_size`` to ``(k + 1) * batch_size - 1``,
pulled in one call (one I/O-pool job for a sync iterator, since ``next()`` may block), in batch
order. So no item is read twice or left out whatever ``num_workers`` (torch's worker processes
each iterate the whole of an unaware ``IterableDataset``); the batches' CPU work still runs in
parallel on the pool. An item's index, for the transform and for ``iter_with_indices``, is its
position in the epoch's stream.

A stream that can split itself (over ranks, or into shards read at once) reads what it needs
from :func:`stream_info` while it is iterated.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import marshal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np

from ._pool import ThreadPool
from ._sampler import batch_count

if TYPE_CHECKING:
    from ._stats import Recorder

logger = logging.getLogger("asyncloader")

_SKIP_TURN: Final = 1024
"""Items an async stream's skip-ahead reads between turns it gives the event loop."""

_FAILURES = (Exception, SystemExit)
"""What an iterator raises that ends its epoch after the items read before it: a SystemExit
too (a library that exits on bad input). Not a KeyboardInterrupt, which ends it at once, nor
a cancellation."""

StreamKind = Literal["sync", "async"]

_Snapshot = bytes | str | Exception | None
"""A stream's state after a batch: marshalled, as JSON, the error that taking it raised, or
none (a stream without a state)."""


def stream_kind(dataset: object) -> StreamKind | None:
    """``"async"`` for a dataset read with ``async for``, ``"sync"`` for one read with
    ``for``, ``None`` for a map-style dataset. A torch ``IterableDataset`` is a stream (its
    ``__getitem__`` is the base class's, which raises); so is anything iterable that lacks
    a ``__getitem__`` or a ``__len__``, the two a map-style dataset needs (Hugging Face's
    streaming ``IterableDataset``, without torch, has a ``__getitem__`` that picks a column).
    With both ``__aiter__`` and ``__iter__``, ``__aiter__`` is used."""
    torch = sys.modules.get("torch")
    is_torch_stream = torch is not None and isinstance(dataset, torch.utils.data.IterableDataset)
    if not is_torch_stream and hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return None
    if hasattr(dataset, "__aiter__"):
        return "async"
    if hasattr(dataset, "__iter__"):
        return "sync"
    return None


def _seed_datapipe(dataset: object, seed: int, epoch: int) -> None:
    """Seed the shuffles of a torch ``IterDataPipe`` (``.shuffle()``) from ``(seed, epoch)``:
    unseeded, each draws from torch's global generator, so no two loaders, ranks or reads of
    an epoch (a resume reads it again) agree on its order."""
    if not _is_datapipe(dataset):
        return
    torch = sys.modules["torch"]
    drawn = np.random.default_rng([seed, epoch]).integers(2**63)
    generator = torch.Generator().manual_seed(int(drawn))
    torch.utils.data.graph_settings.apply_random_seed(dataset, generator)


def _is_datapipe(dataset: object) -> bool:
    """Whether ``dataset`` is a torch ``IterDataPipe`` (torch imported already)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(dataset, torch.utils.data.IterDataPipe)


def is_stateful(dataset: object) -> bool:
    """Whether a stream keeps its own position (``state_dict``/``load_state_dict``)."""
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


def stream_length(dataset: object) -> int | None:
    """The stream's ``len()``, or ``None`` if it has none: no ``__len__``, or one that
    raises ``TypeError`` (torch's ``ChainDataset`` of streams without a length does) or
    ``NotImplementedError``."""
    if not hasattr(dataset, "__len__"):
        return None
    try:
        return len(dataset)
    except (TypeError, NotImplementedError):
        return None


def check_stream_settings(
    dataset: object, shuffle: object, sampler: object, batch_sampler: object, max_errors: object
) -> None:
    """Refuse the settings that order a map-style dataset's indices (a stream has none), and
    a fraction of an epoch's items for a stream that does not say how many it has."""
    if isinstance(max_errors, float) and stream_length(dataset) is None:
        raise ValueError(
            f"max_errors={max_errors} is a fraction of the epoch's items, and this stream has "
            "no __len__: give a count"
        )
    if shuffle and _is_datapipe(dataset):
        raise ValueError(
            "shuffle: a datapipe shuffles itself; turn its shuffles on with "
            "torch.utils.data.graph_settings.apply_shuffle_settings(datapipe, shuffle=True) "
            "(what torch's DataLoader does with shuffle=True), and the loader seeds them "
            "from its seed and the epoch"
        )
    for name, value in (("shuffle", shuffle), ("sampler", sampler)):
        if value:
            raise ValueError(
                f"{name} orders a map-style dataset's indices; a stream dataset has none, so "
                f"{name} must not be given (as in torch): a stream shuffles itself "
                "(TarShards and ParquetShards: shuffle=True, shuffle_buffer=N)"
            )
    if batch_sampler is not None:
        raise ValueError("batch_sampler needs a map-style dataset; this dataset is a stream")


class SampleError:
    """What a stream yields in place of a sample it could not read (a broken shard): that
    sample fails its batch with ``error`` (or, with ``errors="skip"``, is dropped and counted),
    and the stream goes on.

    Args:
        error: Why the sample could not be read.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"SampleError({self.error!r})"


@dataclass(frozen=True)
class StreamInfo:
    """What a stream dataset is told while it is iterated (see :func:`stream_info`).

    The stream is read by one reader, so a stream that splits itself splits only over ranks;
    ``num_workers`` says how many parts (shards) it may read at once to keep the loader busy.
    """

    rank: int
    """This process's rank (the loader's ``rank``)."""
    world_size: int
    """The number of ranks sharing the epoch: read ``1 / world_size`` of the data."""
    epoch: int
    """The epoch being read."""
    seed: int
    """The loader's seed: draw any order from ``(seed, epoch)``, so every rank agrees."""
    num_workers: int
    """The loader's ``num_workers``."""


_current: contextvars.ContextVar[StreamInfo | None] = contextvars.ContextVar(
    "asyncloader_stream", default=None
)


def stream_info() -> StreamInfo | None:
    """The rank, epoch and seed of the epoch that is iterating this stream.

    Call it inside a stream dataset's ``__iter__``/``__aiter__`` (or anywhere in the
    iteration it starts); ``None`` outside a loader's epoch. Inside the stream's
    ``load_state_dict`` (or ``load_elastic``), called by :meth:`DataLoader.load_state_dict`, it
    is the epoch that the state resumes, as it will be when that epoch is read: a stream can
    refuse there a state of another epoch, seed or rank. This is asyncloader's
    ``torch.utils.data.get_worker_info()``: there is one reader, so no worker share to take.
    """
    return _current.get()


@contextlib.contextmanager
def telling(info: StreamInfo) -> Iterator[None]:
    """Make :func:`stream_info` return ``info`` inside the block (on this thread or task)."""
    token = _current.set(info)
    try:
        yield
    finally:
        _current.reset(token)


def _warn_if_used_up(dataset: object, epoch: int) -> None:
    """Say so when a stream that is an iterator (a generator's result) is empty after the
    first epoch: that one used it up, and every epoch from now on would pass with no item,
    silently (as torch's do)."""
    if isinstance(dataset, Iterator) or hasattr(dataset, "__anext__"):
        logger.warning(
            "the dataset is an iterator (%s) that an earlier epoch used up: epoch %d has no "
            "item; pass an object whose __iter__ (or __aiter__) starts again, such as an "
            "IterableDataset",
            type(dataset).__name__,
            epoch,
        )


class StreamReader:
    """One epoch's iterator over a stream, pulled one batch at a time in batch order.

    Args:
        dataset: The stream.
        kind: ``"sync"`` or ``"async"``.
        io: The pool that runs a sync stream's ``next()`` calls.
        info: What :func:`stream_info` returns during the epoch.
        first: The batches of the epoch received before this reader starts (a resume).
        skip: Items to read and drop first (a resume of a stream without its own state).
        drop_last: Whether a short last batch is dropped.
        window: Batches that may be pulled ahead of the consumer (how many states to keep).
        length: The stream's ``__len__``, if it has one: a stream that gives more items is
            logged, once (``len(loader)`` undercounts its epoch, as torch warns).
    """

    def __init__(
        self,
        dataset: Any,
        kind: StreamKind,
        io: ThreadPool,
        info: StreamInfo,
        *,
        first: int,
        skip: int,
        drop_last: bool,
        window: int,
        length: int | None = None,
    ) -> None:
        self._dataset = dataset
        self._length = length
        self._async = kind == "async"
        self._io = io
        self._info = info
        self._skip = skip
        self._drop_last = drop_last
        self._window = window
        self._iterator: Any = None
        self._lock = asyncio.Lock()
        self._thread_lock = threading.Lock()  # one thread at a time in a sync iterator
        self._stateful = is_stateful(dataset)
        self._pulled = first
        self._states: dict[int, _Snapshot] = {}
        self.ended = False
        """Whether the stream has no item left for this epoch (or failed, or was cut off)."""
        self.end: int | None = None
        """The epoch's batches, once the stream's end (or its error) is found."""
        self._failure: BaseException | None = None
        """The iterator's error, raised at the batch after the items read before it."""

    async def pull(self, count: int, recorder: Recorder) -> list[Any]:
        """The next ``count`` items (fewer at the stream's end; none after it, nor for a short
        last batch under ``drop_last``). An error of the iterator ends the epoch's stream: the
        items read before it come out as a short batch, and the error is raised at the next
        (at once if there were none). ``recorder`` counts the read of the iterator as a
        dataset call: not the wait for the reader, which reads one batch at a time."""
        async with self._lock:
            if self._failure is not None:
                failure, self._failure = self._failure, None
                self.ended, self.end = True, self._pulled + 1  # the failed batch is the last
                raise failure
            if self.ended:
                return []
            started = recorder.fetch_started(count)
            read: list[Any] | None = None
            try:
                if self._async:
                    with telling(self._info):
                        read, ended, state = await self._pull_async(count)
                else:
                    read, ended, state = await self._io.run(self._pull_sync, count)
            except BaseException:
                self.ended, self.end = True, self._pulled + 1
                raise
            finally:
                recorder.fetch_done(started, read, count)
            assert read is not None  # else the read raised
            items = read
            self._pulled += 1
            # Every batch before this one was whole (a short one ends the stream).
            if self._length is not None and (self._pulled - 1) * count + len(items) > self._length:
                logger.warning(
                    "%s.__len__() is %d, but the stream gave more items",
                    type(self._dataset).__name__,
                    self._length,
                )
                self._length = None  # once an epoch
            if state is not None:
                self._states[self._pulled] = state
                self._states.pop(self._pulled - self._window - 2, None)
            if self._failure is not None:  # the items read before the iterator's error
                if items and not self._drop_last:
                    return items
                return await self._raise_failure()
            if ended and not read and self._pulled == 1 and self._info.epoch > 0:
                _warn_if_used_up(self._dataset, self._info.epoch)
            if ended and (not items or (self._drop_last and len(items) < count)):
                items = []
            if ended:
                self.ended = True
                self.end = self._pulled if items else self._pulled - 1
        return items

    async def _raise_failure(self) -> list[Any]:
        failure, self._failure = self._failure, None
        assert failure is not None
        self.ended, self.end = True, self._pulled  # this batch, failed, is the last
        raise failure

    def state_after(self, batches: int) -> str | None:
        """The stream's own state (as JSON) once ``batches`` batches of the epoch were pulled,
        if it has one and it is still kept.

        Raises:
            TypeError: The stream's ``state_dict()`` failed or was not JSON-serialisable.
        """
        state = self._states.get(batches)
        try:
            if isinstance(state, Exception):
                raise state
            return json.dumps(marshal.loads(state)) if isinstance(state, bytes) else state
        except Exception as error:
            raise TypeError(
                f"{type(self._dataset).__name__}.state_dict() gave no JSON-serialisable "
                f"state: {error}"
            ) from None

    def _snapshot(self) -> _Snapshot:
        """The stream's state now, copied (later reading must not change it). marshal copies
        plain data several times faster than JSON encodes it, and it runs after every batch;
        the JSON is written only for the state asked for (:meth:`state_after`)."""
        if not self._stateful:
            return None
        try:
            state = self._dataset.state_dict()
        except Exception as error:  # raised where the state is asked for, not here
            return error
        try:
            return marshal.dumps(state)
        except ValueError:  # not plain data (a dict subclass, say): JSON at once
            try:
                return json.dumps(state)
            except Exception as error:
                return error

    def _begin(self) -> None:
        """Tell the stream the epoch, if it asks (``set_epoch``: Hugging Face's streaming
        datasets draw their shuffles from it); seed a torch datapipe's shuffles from the seed
        and the epoch, as torch's loader seeds them from its generator."""
        set_epoch = getattr(self._dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self._info.epoch)
        _seed_datapipe(self._dataset, self._info.seed, self._info.epoch)

    def _pull_sync(self, count: int) -> tuple[list[Any], bool, _Snapshot]:
        with self._thread_lock, telling(self._info):
            items: list[Any] = []
            try:
                if self._iterator is None:
                    self._begin()
                    self._iterator = iter(self._dataset)
                    for _ in range(self._skip):
                        next(self._iterator)
                for _ in range(count):
                    items.append(next(self._iterator))
            except StopIteration:
                return items, True, self._snapshot()
            except _FAILURES as error:  # raised after the items read before it
                self._failure = error
                return items, True, None
            return items, False, self._snapshot()

    async def _pull_async(self, count: int) -> tuple[list[Any], bool, _Snapshot]:
        items: list[Any] = []
        try:
            if self._iterator is None:
                self._begin()
                self._iterator = self._dataset.__aiter__()
                for skipped in range(self._skip):
                    await self._iterator.__anext__()
                    if skipped % _SKIP_TURN == _SKIP_TURN - 1:
                        # A generator that never waits would hold the loop for the whole
                        # skip, deaf to close() and to cancellation.
                        await asyncio.sleep(0)
            for _ in range(count):
                items.append(await self._iterator.__anext__())
        except StopAsyncIteration:
            return items, True, self._snapshot()
        except _FAILURES as error:  # raised after the items read before it
            self._failure = error
            return items, True, None
        return items, False, self._snapshot()

    async def aclose(self) -> None:
        """Close the epoch's iterator (a generator's ``finally`` runs), unless it is the
        dataset itself (a generator given as the dataset goes on where it stopped)."""
        iterator, self._iterator = self._iterator, None
        self.ended = True
        if iterator is None or iterator is self._dataset:
            return
        if self._async:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:
                    logger.exception("closing the stream's iterator failed")
        elif callable(getattr(iterator, "close", None)):
            # After any next() still running on a thread (nobody waits for it).
            try:
                self._io.submit(self._close_sync, iterator)
            except RuntimeError:  # the pool was replaced, busy (Ctrl-C): a thread of its own
                threading.Thread(
                    target=self._close_sync,
                    args=(iterator,),
                    name="asyncloader-stream-close",
                    daemon=True,
                ).start()

    def _close_sync(self, iterator: Any) -> None:
        with self._thread_lock:
            try:
                iterator.close()
            except Exception:
                logger.exception("closing the stream's iterator failed")


class StreamBatches:
    """An epoch of a stream as the driver's batches: the positions of consecutive items,
    until the reader finds the stream's end.

    Args:
        reader: The epoch's reader.
        batch_size: Items per batch.
        first: Batches of the epoch already received (a resume).
        length: The stream's ``len()``, if it has one.
        drop_last: Whether a short last batch is dropped.
    """

    def __init__(
        self,
        reader: StreamReader,
        batch_size: int,
        first: int,
        length: int | None,
        drop_last: bool,
    ) -> None:
        self.reader = reader
        self.first = first
        self.length = length
        self._batch_size = batch_size
        self._drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        size = self._batch_size
        start = self.first * size
        while not self.reader.ended:
            yield list(range(start, start + size))
            start += size

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("the stream dataset has no __len__, so its epoch has no length")
        return max(0, batch_count(self.length, self._batch_size, self._drop_last) - self.first)
