"""``DataLoader``: the settings and pieces of a loader; each iteration runs one epoch."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from ._collate import default_collate, unbatched
from ._driver import EpochBatches
from ._epoch import EpochContext
from ._iterators import AsyncEpochIterator, DirectIterator, Fresh, ThreadedIterator
from ._map_epochs import MapEpochs
from ._order import Order, check_batch_sampler
from ._pin import pin_batch, pinning_available
from ._runtime import CLOSE_TIMEOUT_S, Runtime
from ._sampler import Batches, ListedBatches
from ._settings import ReadOnly, Settings, check_callable, check_int
from ._shared import held_limit
from ._skip import ErrorPolicy, Skipper, check_errors, epoch_budget
from ._source import Source, is_async_dataset
from ._state import Progress, Resume, check_json
from ._stats import LoaderStats, Recorder
from ._stream import StreamBatches, check_stream_settings, stream_kind
from ._stream_epochs import StreamEpochs
from ._torch_settings import check_torch_settings
from ._transform import Transform
from ._work import PickledWork, pickle_work
from ._worker import Work

logger = logging.getLogger("asyncloader")

_FOLLOW = "_follow_ranks"
"""What the attributes that depend on the ranks call first: ranks left to the environment
are read again (a process group may have started since the loader was built)."""


class DataLoader:
    """Batches of a dataset, in order, with bounded prefetching; one epoch per iteration.

    ``for batch in loader`` runs an epoch on the loader's own background event loop (or inline
    on the direct path); ``async for batch in loader`` runs it on the caller's loop.

    A loader pickles and deep-copies as torch's does (``multiprocessing``'s spawn, Lightning's
    ``ddp_spawn``): the copy is built again from the same arguments, with the same seed, count
    of epochs and loaded state not yet used, and starts the next epoch the original would
    (never its threads, processes or an epoch in progress). A rank left to the environment
    is read again where the copy is made.

    Args:
        dataset: A map-style dataset: ``__len__`` and ``__getitem__`` (sync or ``async def``),
            optionally ``__getitems__(indices)`` and, for async datasets, ``async def aclose()``.
            Or a stream: ``__iter__`` or ``async def __aiter__`` and no ``__getitem__`` (a torch
            ``IterableDataset``, a generator), read once per epoch in its order by one reader
            (``docs/streaming.md``).
        batch_size: Samples per batch, at least 1. ``None`` (as in torch) turns batching off:
            each item comes out alone, ``collate_fn`` called with the item itself (by default
            the item as it is), and ``len(loader)`` counts items.
        shuffle: Draw a new permutation every epoch from ``(seed, epoch)``; ``None`` (torch's
            default) is ``False``.
        sampler: Any finite iterable of ``int`` (read whole at the start of each epoch) or a
            :class:`Sampler`; exclusive with ``shuffle``.
        batch_sampler: Any iterable of index lists (a torch ``BatchSampler`` too), read whole at
            the start of each epoch: each list is a batch. Exclusive with ``batch_size``,
            ``shuffle``, ``sampler`` and ``drop_last``, as in torch.
        seed: The seed of shuffling (and of random transforms); drawn once from the OS when
            ``None``, or 0 with more than one rank (every rank must draw the same order).
        generator: A ``torch.Generator`` the seed is drawn from (torch's way of seeding the
            shuffle); exclusive with ``seed``.
        drop_last: Drop the last batch of an epoch when it is short.
        transform: ``f(index, item) -> item``, run on the CPU pool.
        collate_fn: Turns a batch's items into one value; :func:`default_collate` by default.
        num_workers: Batches in work at once; 0 processes them inline when possible.
        item_concurrency: Requests in flight are ``max(num_workers, 1) * item_concurrency``
            for the whole epoch, taken in epoch order across batches (``docs/settings.md``),
            and never more than the items of the batches the window holds.
            At 1 a batch is fetched in one call when the dataset allows it.
        prefetch_depth: At least 1: no batch starts more than ``max(num_workers, 1) +
            prefetch_depth`` batches ahead of the one you take next (the memory bound).
        cpu_threads: Threads of the CPU pool; the CPUs available by default.
        cpu_processes: Run the CPU stage in this many worker processes instead of threads
            (exclusive with ``cpu_threads``), for work that holds the GIL: a sync dataset's
            ``__getitem__``/``__getitems__`` with the transform and the collation, or, for an
            async dataset or a stream, the transform and the collation only. Started once
            per loader, from a fork server that imports only what they need (never a fork
            of this process), fed the dataset, transform and ``collate_fn`` once, as they
            were when the loader was built (so they must pickle); batches come back in
            shared memory. Until a worker is ready, one CPU thread makes the batches. At
            least two batches per process are in work. A script that defines any of them
            must build the loader under ``if __name__ == "__main__":``
            (``docs/processes.md``).
        timeout: Seconds to wait for one batch before ``TimeoutError``; ``None`` (or ``0``, as
            in torch) waits forever. Honoured on every path: with a time-out, an epoch that
            would run inline runs on the loader's loop thread.
        pin_memory: Pin torch batches: their tensors, and values with a ``pin_memory()``
            method, as torch pins them (a no-op with a warning when CUDA is absent).
        rank: This process's rank; by default ``torch.distributed``'s when it is initialised,
            else ``RANK`` from the environment (torchrun sets it), else 0 (a ``ValueError``
            where ``world_size`` above 1 is given: each process must know its own).
        world_size: The number of ranks, found the same way (else 1). With more than one
            rank and no ``sampler``, each rank reads its share through a
            :class:`DistributedSampler` (``shuffle``, ``seed`` and ``drop_last`` passed on).
            Ranks left to be found are found again before each epoch (and for ``len()``
            and a state), so a loader built before the process group starts (Lightning's
            ``Trainer`` starts it inside ``fit``) reads its rank's share.
        errors: ``"raise"``: a failing item fails its batch. ``"skip"``: it is dropped from its
            batch (which comes out short; one left with no item is passed over), logged once
            with its index and the reason, and counted in :meth:`stats`.
        max_errors: With ``errors="skip"``, the items an epoch may drop: a count, or a
            fraction of the epoch's items; one more raises :class:`SkipBudgetExceeded`
            listing the first failures. ``None``: no limit.
        prefetch_factor: torch's batches loaded ahead by each worker: with it, the window is
            torch's, ``num_workers * prefetch_factor`` batches (at least one beyond those in
            work); exclusive with ``prefetch_depth``, and needs ``num_workers``, as in torch.
        persistent_workers: Taken, as torch's: the loader's threads and worker processes
            always persist across epochs.
        in_order: Taken, as torch's: batches always come in order (``False`` allows
            another order; it does not ask for one).
        worker_init_fn: With ``cpu_processes``, called in each worker process with its
            number (``0`` to ``cpu_processes - 1``) once the dataset is loaded there, before
            its first batch, as torch calls it in each of its workers (a worker that takes
            a dead one's place calls it again); ``torch.utils.data.get_worker_info()``
            there gives the worker's number, their count, its seed and its copy of the
            dataset. Every batch is then made in a worker, the first ones too. Exceptions
            it raises fail every batch, saying why. Refused without ``cpu_processes``.
        multiprocessing_context: ``None`` only (``cpu_processes`` start from a fork server
            of the loader's own).
        pin_memory_device: ``""`` only (deprecated in torch: ``pin_memory`` pins for the
            current accelerator).

    Raises:
        TypeError: A setting has the wrong type, or the dataset is neither a map-style dataset
            nor a stream.
        ValueError: A setting is out of range, or exclusive settings are given together.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = False,
        sampler: object = None,
        batch_sampler: object = None,
        *,
        seed: int | None = None,
        generator: Any = None,
        drop_last: bool = False,
        transform: Transform | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        item_concurrency: int = 1,
        prefetch_depth: int = 2,
        cpu_threads: int | None = None,
        cpu_processes: int | None = None,
        timeout: float | None = None,
        pin_memory: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        errors: ErrorPolicy = "raise",
        max_errors: int | float | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        worker_init_fn: Callable[[int], object] | None = None,
        multiprocessing_context: None = None,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        # What it was built with, as given: a copy is built again from it (__reduce__).
        self._given: dict[str, Any] = {k: v for k, v in locals().items() if k != "self"}
        self._unbatched = batch_size is None
        kind = stream_kind(dataset)
        if kind is not None:
            check_stream_settings(dataset, shuffle, sampler, batch_sampler, max_errors)
        batch_sampler = check_batch_sampler(batch_sampler, batch_size, shuffle, sampler, drop_last)
        if self._unbatched and drop_last:
            raise ValueError("batch_size=None turns batching off: drop_last=True has no meaning")
        self._settings = Settings.build(
            batch_size=1 if batch_size is None or batch_sampler is not None else batch_size,
            drop_last=drop_last,
            num_workers=num_workers,
            item_concurrency=item_concurrency,
            prefetch_depth=prefetch_depth,
            cpu_threads=cpu_threads,
            timeout=timeout,
            pin_memory=pin_memory,
            cpu_processes=cpu_processes,
        )
        depth = check_torch_settings(
            self._settings,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self._settings = dataclasses.replace(self._settings, prefetch_depth=depth)
        # What torch's loader lets code read back, as given (collate_fn as it runs).
        self._as_given = SimpleNamespace(
            transform=transform,
            collate_fn=default_collate if collate_fn is None else collate_fn,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        check_callable("transform", transform, ("index", "item"))
        check_callable("collate_fn", collate_fn, ("items",))
        self._order = Order(
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            seed=seed,
            generator=generator,
            rank=rank,
            world_size=world_size,
            drop_last=self._settings.drop_last,
        )
        self._epochs: MapEpochs | StreamEpochs = (
            MapEpochs(dataset, self._order, self._settings, self.batch_size)
            if kind is None
            else StreamEpochs(dataset, kind, self._order, self._settings, self.batch_size)
        )
        self._is_async = kind == "async" if kind else is_async_dataset(dataset)
        self._needs_io = kind is not None or not self._is_async
        self._dataset = dataset
        self._transform = transform
        collate = default_collate if collate_fn is None else collate_fn
        if self._unbatched:
            collate = unbatched(collate_fn)
        pin = self._settings.pin_memory and pinning_available()
        self._after = pin_batch if pin and self._settings.cpu_processes else None
        if pin and not self._settings.cpu_processes:
            self._collate: Callable[[list[Any]], Any] = lambda items: pin_batch(collate(items))
        else:
            self._collate = collate
        self._max_errors = check_errors(errors, max_errors)
        self._skip = errors == "skip"
        self._work = self._pickled_work(kind) if self._settings.cpu_processes else None
        limit = self._settings.requests_in_flight if kind is None else 1  # a stream: a reader
        if self._work is not None and kind is None and not self._is_async:
            limit = self._settings.batch_tasks  # batches fetched whole in worker processes
        interleave, shards = _shard_stream(dataset) if kind is not None else (0, 0)
        self._recorder = Recorder(
            limit,
            self._settings.cpu_threads,
            stream=kind is not None,
            processes=self._settings.cpu_processes,
            interleave=interleave,
            shards=shards,
        )
        self._epoch = 0
        self._progress: Progress | None = None
        self._resume: Resume | None = None
        self._started_from: Resume | None = None
        """The loaded state the last epoch started from, if any."""
        self._skipper: Skipper | None = None
        self._runtime: Runtime | None = None
        self._async_epochs: weakref.WeakSet[AsyncEpochIterator] = weakref.WeakSet()
        """The ``async for`` epochs not yet collected, which :meth:`aclose` ends first."""

    def _pickled_work(self, kind: str | None) -> PickledWork:
        """What the worker processes run, pickled now, so that what cannot be sent fails
        here, named."""
        fetched_there = kind is None and not self._is_async
        if fetched_there and self._settings.item_concurrency > 1:
            raise ValueError(
                f"item_concurrency={self._settings.item_concurrency} with cpu_processes: a "
                "sync dataset's batch is fetched whole in a worker process; for requests in "
                "flight, use an async dataset (its requests stay on the event loop)"
            )
        dataset = self._dataset if fetched_there else None
        held = held_limit(self._settings.cpu_processes)
        processes = self._settings.cpu_processes
        init = self._as_given.worker_init_fn
        return pickle_work(
            Work(dataset, self._transform, self._collate, self._skip, held, processes, init)
        )

    @property
    def dataset(self) -> Any:
        """The dataset."""
        return self._dataset

    sampler = ReadOnly[object]("_order", "The sampler that orders each epoch.", _FOLLOW)
    batch_sampler = ReadOnly[object]("_order", "The batch sampler, if one was given.")
    drop_last = ReadOnly[bool]("_settings", "Whether a short last batch is dropped.")
    num_workers = ReadOnly[int]("_settings", "Batches processed at once.")
    item_concurrency = ReadOnly[int]("_settings", "Requests in flight per num_workers.")
    prefetch_depth = ReadOnly[int]("_settings", "Batches beyond num_workers that may start ahead.")
    cpu_threads = ReadOnly[int]("_settings", "Threads of the CPU pool.")
    cpu_processes = ReadOnly[int]("_settings", "Worker processes of the CPU stage (0: none).")
    timeout = ReadOnly["float | None"]("_settings", "Seconds to wait for one batch, or None.")
    pin_memory = ReadOnly[bool]("_settings", "Whether torch batches are pinned.")
    transform = ReadOnly[object]("_as_given", "The per-item transform, if one was given.")
    collate_fn = ReadOnly[Callable[[list[Any]], Any]]("_as_given", "The collate function.")
    generator = ReadOnly[object]("_as_given", "The torch.Generator given, if any.")
    prefetch_factor = ReadOnly["int | None"]("_as_given", "torch's prefetch_factor, as given.")
    persistent_workers = ReadOnly[bool]("_as_given", "As given (always so here).")
    worker_init_fn = ReadOnly["Callable[[int], object] | None"](
        "_as_given", "What each worker process of cpu_processes calls as it starts, if given."
    )
    multiprocessing_context = ReadOnly[None]("_as_given", "None (see cpu_processes).")
    pin_memory_device = ReadOnly[str]("_as_given", "As given (deprecated in torch).")
    in_order = ReadOnly[bool]("_as_given", "As given (batches always come in order).")
    seed = ReadOnly[int]("_order", "The seed of shuffling and of random transforms.", _FOLLOW)
    rank = ReadOnly[int]("_order", "This process's rank.", _FOLLOW)
    world_size = ReadOnly[int]("_order", "The number of ranks sharing each epoch.", _FOLLOW)

    @property
    def batch_size(self) -> int | None:
        """Samples per batch (``None`` with ``batch_sampler`` or without batching, as torch)."""
        if self._unbatched or self._order.batch_sampler is not None:
            return None
        return self._settings.batch_size

    @property
    def epoch(self) -> int:
        """The number of the epoch the next iteration runs (0 for the first).

        An epoch whose iterator has given nothing yet is run again by the next iteration:
        one made and dropped (Lightning's ``Trainer`` makes one to check that the loader is
        iterable) is not counted, so the epochs are numbered as the consumer received them.
        """
        previous = self._progress
        if (
            self._resume is None
            and previous is not None
            and not previous.done
            and previous.received == 0
            and previous.batches != 0  # an empty epoch is over once it starts
            and previous.offset == 0  # an elastic epoch's start needs its loaded state
        ):
            return previous.epoch
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run epoch ``epoch`` (its order is drawn from it).

        A loaded state still applies if its epoch is the one that runs next; an epoch left
        unfinished is forgotten, so :meth:`state_dict` then names epoch ``epoch``.
        """
        self._epoch = check_int("epoch", epoch, 0)
        self._progress = None

    def stats(self) -> LoaderStats:
        """Per-stage statistics since the loader was built (or :meth:`reset_stats`)."""
        return self._recorder.snapshot()

    def reset_stats(self) -> None:
        """Count the statistics from zero again."""
        self._recorder.reset()

    def state_dict(self) -> dict[str, Any]:
        """The loader's position, as a small JSON-serialisable dict.

        It counts the batches the consumer received (a failed batch too), never the ones
        merely prefetched. Between epochs it names the next epoch with 0 batches received;
        after :meth:`load_state_dict` and before the next batch, the position loaded.
        """
        self._follow_ranks()
        resume = self._resume
        if resume is not None and resume.epoch == self._epoch:
            return {**json.loads(json.dumps(resume.state)), "rank": self.rank}
        return self._epochs.state(self._progress, self._epoch)

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Continue from ``state``: the next epoch yields the batches it had not yet handed over.

        Loaded by a different number of ranks than saved it, the epoch continues elastically:
        this rank gets its share of the samples that no rank had received. For shards
        (``TarShards``, ``ParquetShards``), pass the list of the states every rank saved.

        Raises:
            ValueError: The state is not one this loader could have saved: a field missing,
                unknown, out of range, or different from this loader's (another format,
                dataset length, batch size, ``drop_last``, seed or sampler order, a position
                past the end of its epoch). The message names the field, and the loader is
                left as it was.
        """
        check_json(state)
        self._follow_ranks()
        resume = self._epochs.load(state)
        self._epoch, self._progress, self._resume = resume.epoch, None, resume

    def __len__(self) -> int:
        """The number of batches per epoch (PyTorch's convention).

        Raises:
            TypeError: The sampler has no ``__len__``.
        """
        self._follow_ranks()
        return self._epochs.length()

    def _start_epoch(self) -> tuple[EpochBatches, Progress]:
        """Fix the batches of the next epoch (the sampler is read whole, now).

        After a loaded state, the batches already received are left out, never fetched.
        """
        self._order.follow_ranks()
        self._epoch = self.epoch
        resume, self._resume = self._resume, None
        self._started_from = resume
        batches, progress, items = self._epochs.start(self._epoch, resume, self._runtime_here().io)
        self._epoch = progress.epoch + 1
        self._progress = progress
        budget = epoch_budget(self._max_errors, items)
        self._skipper = Skipper(budget, self._recorder) if self._skip else None
        return batches, progress

    def _replanned(self, progress: Progress) -> Fresh | None:
        """The epoch to run instead of ``progress``'s, planned now, if its sampler's user set
        another epoch after it was planned and before its first batch (Lightning's
        ``Trainer`` makes a resumed run's first iterator, then calls ``set_epoch``; torch's
        loader reads its sampler at the first batch, where the epoch set is the one read)."""
        if self._progress is not progress or not self._order.epoch_changed():
            return None
        with self._refused_as_it_was():
            self._resume = self._started_from  # for the epoch it was loaded for, if that runs
            batches, progress = self._start_epoch()
            return self._context(self._runtime_here(), progress.epoch, batches), batches, progress

    def _follow_ranks(self) -> None:
        """Read again the ranks left to the environment (:meth:`Order.follow_ranks`), unless
        an epoch is under way: its batches are cut for the ranks it started with."""
        progress = self._progress
        if progress is None or progress.done or progress.received == 0:
            self._order.follow_ranks()

    def _runtime_here(self) -> Runtime:
        # After fork() the inherited threads do not exist: build new ones, leave the old alone.
        if self._runtime is None or self._runtime.pid != os.getpid():
            close = getattr(self._dataset, "aclose", None) if self._is_async else None
            self._runtime = Runtime(
                self._settings.cpu_threads,
                self._settings.requests_in_flight,
                closers=[close] if close is not None else [],
                processes=self._settings.cpu_processes,
                work=self._work,
            )
        return self._runtime

    def _context(self, runtime: Runtime, epoch: int, batches: EpochBatches) -> EpochContext:
        """The epoch's context; its pools start threads only when first used."""
        return EpochContext(
            # A stream is read by its reader; its Source only names the dataset.
            source=Source(self._dataset, runtime.io if self._needs_io else None),
            transform=self._transform,
            collate=self._collate,
            cpu=runtime.cpu,
            batch_tasks=self._settings.batch_tasks,
            item_concurrency=self._settings.item_concurrency,
            lanes=self._lanes(batches),
            recorder=self._recorder,
            skipper=self._skipper,
            augment=(self._order.seed, epoch),  # the ranks were just read: not again
            stream=batches.reader if isinstance(batches, StreamBatches) else None,
            procs=runtime.procs,
            after=self._after,
        )

    @contextlib.contextmanager
    def _refused_as_it_was(self) -> Iterator[None]:
        """An epoch that cannot start (its sampler raised, the system gives no thread for its
        loop) leaves the loader as it was: the same next epoch, a loaded state kept."""
        saved = self._epoch, self._progress, self._resume, self._skipper
        try:
            yield
        except BaseException:
            self._epoch, self._progress, self._resume, self._skipper = saved
            raise

    def _lanes(self, batches: EpochBatches) -> int:
        """The epoch's lanes: its requests in flight, but no more than the items of the
        batches its window holds, nor its items (a stream's, which a reader reads, are not
        known): a lane past them would only wait, a task or a thread each."""
        settings = self._settings
        if not isinstance(batches, Batches | ListedBatches):
            return settings.requests_in_flight
        usable = (settings.window + 1) * batches.largest
        return max(1, min(settings.requests_in_flight, usable, batches.items))

    def _iterate(self, with_indices: bool) -> DirectIterator | ThreadedIterator:
        with self._refused_as_it_was():
            return self._start_iterator(with_indices)

    def _start_iterator(self, with_indices: bool) -> DirectIterator | ThreadedIterator:
        settings = self._settings
        batches, progress = self._start_epoch()
        runtime = self._runtime_here()
        context = self._context(runtime, progress.epoch, batches)
        # The direct path cannot stop a batch that outlasts `timeout`: with one, the epoch
        # runs on the loop thread, whose hand-off honours it.
        direct = (
            not self._is_async
            and settings.num_workers == 0
            and settings.timeout is None
            and not settings.cpu_processes
        )
        if direct and settings.item_concurrency == 1 and isinstance(batches, Sequence):
            return DirectIterator(context, batches, with_indices, progress, self._replanned)
        return ThreadedIterator(
            runtime,
            context,
            batches,
            settings.window,
            settings.timeout,
            with_indices,
            progress,
            self._replanned,
        )

    def _aiterate(self, with_indices: bool) -> AsyncEpochIterator:
        with self._refused_as_it_was():
            return self._start_async_iterator(with_indices)

    def _start_async_iterator(self, with_indices: bool) -> AsyncEpochIterator:
        batches, progress = self._start_epoch()
        runtime = self._runtime_here()
        epoch = AsyncEpochIterator(
            runtime,
            self._context(runtime, progress.epoch, batches),
            batches,
            self._settings.window,
            self._settings.timeout,
            with_indices,
            progress,
            self._replanned,
        )
        self._async_epochs.add(epoch)
        return epoch

    def __iter__(self) -> Iterator[Any]:
        """Run one epoch; yield its batches in order."""
        return self._iterate(with_indices=False)

    def __aiter__(self) -> AsyncIterator[Any]:
        """Run one epoch on the running event loop; yield its batches in order."""
        return self._aiterate(with_indices=False)

    def iter_with_indices(self) -> Iterator[tuple[list[int], Any]]:
        """Run one epoch; yield ``(indices, batch)`` pairs in order."""
        return self._iterate(with_indices=True)

    def aiter_with_indices(self) -> AsyncIterator[tuple[list[int], Any]]:
        """Run one epoch on the running event loop; yield ``(indices, batch)`` pairs."""
        return self._aiterate(with_indices=True)

    def close(self) -> None:
        """Await an async dataset's ``aclose()`` (bounded, on the loader's loop thread) and
        stop the loader's threads; after ``for`` or ``async for`` use alike.

        Idempotent. A later iteration starts new threads.
        """
        self._stop_runtime(dataset_closed=False)

    async def aclose(self) -> None:
        """End the ``async for`` epochs still open, await an async dataset's ``aclose()`` on
        the running loop, then stop the threads."""
        # First: the dataset is closed after the epochs' calls into it, never under them (an
        # async generator cannot even be closed while an epoch waits in it).
        for epoch in list(self._async_epochs):
            await epoch.aclose()
        close = getattr(self._dataset, "aclose", None) if self._is_async else None
        if close is not None and self._runtime is not None:
            try:
                await asyncio.wait_for(close(), CLOSE_TIMEOUT_S)
            except Exception:
                logger.exception("%s.aclose() failed", type(self._dataset).__name__)
        runtime = self._detach_runtime()
        if runtime is None:
            return
        # Off the caller's loop: stopping worker processes waits for them to exit (for a call
        # of the user's code to return, or a while before a kill).
        stop = functools.partial(runtime.close, run_closers=False)
        try:
            stopped = asyncio.get_running_loop().run_in_executor(None, stop)
        except RuntimeError:  # the loop's executor is shut down: the loop is ending
            stop()
        else:
            await stopped

    def _stop_runtime(self, dataset_closed: bool) -> None:
        runtime = self._detach_runtime()
        if runtime is not None:
            runtime.close(run_closers=not dataset_closed)

    def _detach_runtime(self) -> Runtime | None:
        """The loader's runtime, no longer the loader's; ``None`` if there is none to stop here
        (one inherited through ``fork()`` is the parent's)."""
        runtime, self._runtime = self._runtime, None
        return runtime if runtime is not None and runtime.pid == os.getpid() else None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and deep-copied as torch's loader is: what it was built with, its seed
        (one drawn from the OS too), its count of epochs and a loaded state not yet used;
        never its threads, processes, statistics or an epoch in progress. The copy starts
        the next epoch the original would start."""
        seed = self.seed
        return (_rebuilt, (self._given, seed, self._order.seed_drawn, self._epoch, self._resume))

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> DataLoader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        s = self._settings
        return (
            f"DataLoader({type(self._dataset).__name__}, batch_size={s.batch_size}, "
            f"num_workers={s.num_workers}, item_concurrency={s.item_concurrency}, "
            f"prefetch_depth={s.prefetch_depth})"
        )


def _shard_stream(dataset: object) -> tuple[int, int]:
    """A shard stream's ``interleave`` and count of shards (``TarShards``,
    ``ParquetShards``; 0 where it does not say); ``(0, 0)`` for any other stream."""
    interleave = getattr(dataset, "interleave", 0)
    if type(interleave) is not int:
        return 0, 0
    try:
        shards = len(getattr(dataset, "shards", ()))
    except TypeError:  # a stream's own `shards` attribute, of no length
        shards = 0
    return interleave, shards


def _rebuilt(
    given: dict[str, Any], seed: int, drawn: bool, epoch: int, resume: Resume | None
) -> DataLoader:
    """A copy of a loader (see :meth:`DataLoader.__reduce__`)."""
    loader = DataLoader(**given)
    if not loader._order.seed_given:
        loader._order.adopt_seed(seed, drawn)
    loader._epoch, loader._resume = epoch, resume
    return loader
