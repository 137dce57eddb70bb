"""``DataLoader``: the settings and pieces of a loader; each iteration runs one epoch."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import AsyncIterator as AsyncIteratorABC
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

from ._collate import default_collate
from ._distributed import resolve_ranks
from ._driver import Work
from ._iterators import AsyncIterator, DirectIterator, ThreadedIterator
from ._pin import pin_batch, pinning_available
from ._runtime import CLOSE_TIMEOUT_S, Runtime
from ._sampler import (
    Batches,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    batch_count,
    cut_batches,
    read_sampler,
    sampler_length,
)
from ._settings import Settings, check_bool, check_int
from ._skip import Skipper, check_errors, epoch_budget
from ._source import Source, is_async_dataset
from ._state import (
    FORMAT,
    Progress,
    Resume,
    check_compatible,
    elastic_indices,
    order_of,
    sampler_state,
)
from ._stats import LoaderStats, Recorder
from ._transform import Transform

logger = logging.getLogger("asyncloader")


def _check_callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {value!r}")


class DataLoader:
    """Batches of a dataset, in order, with bounded prefetching; one epoch per iteration.

    ``for batch in loader`` runs an epoch on the loader's own background event loop (or inline
    on the direct path); ``async for batch in loader`` runs it on the caller's loop.

    Args:
        dataset: A map-style dataset: ``__len__`` and ``__getitem__`` (sync or ``async def``),
            optionally ``__getitems__(indices)`` and, for async datasets, ``async def aclose()``.
        batch_size: Samples per batch, at least 1.
        shuffle: Draw a new permutation every epoch from ``(seed, epoch)``; ``None`` (torch's
            default) is ``False``.
        sampler: Any finite iterable of ``int`` (read whole at the start of each epoch) or a
            :class:`Sampler`; exclusive with ``shuffle``.
        seed: The seed of shuffling (and of random transforms); drawn once from the OS when
            ``None``.
        drop_last: Drop the last batch of an epoch when it is short.
        transform: ``f(index, item) -> item``, run on the CPU pool.
        collate_fn: Turns a batch's items into one value; :func:`default_collate` by default.
        num_workers: Batches processed at once; 0 processes them inline when possible.
        item_concurrency: Items of one batch fetched at once. Requests in flight are
            ``max(num_workers, 1) * item_concurrency``; for throughput prefer more batches of
            a few lanes (4) to few batches of many, for a sooner first batch more lanes
            (``docs/settings.md``). At 1 a batch of a sync dataset (or of an async one with
            ``__getitems__``) is fetched in one call, and its transforms are split over the CPU
            threads when they take milliseconds.
        prefetch_depth: Finished batches that may wait for the consumer, at least 1.
        cpu_threads: Threads of the CPU pool; the CPUs available by default.
        timeout: Seconds to wait for one batch before ``TimeoutError``; ``None`` (or ``0``, as
            in torch) waits forever. Honoured on every path: with a time-out, an epoch that
            would run inline runs on the loader's loop thread.
        pin_memory: Pin torch batches (a no-op with a warning when CUDA is absent).
        rank: This process's rank; by default ``torch.distributed``'s when it is initialised,
            else ``RANK`` from the environment (torchrun sets it), else 0.
        world_size: The number of ranks, found the same way (else 1). With more than one
            rank and no ``sampler``, each rank reads its share through a
            :class:`DistributedSampler` (``shuffle``, ``seed`` and ``drop_last`` passed on).
        errors: ``"raise"``: a failing item fails its batch. ``"skip"``: it is dropped from its
            batch (which comes out short), logged once with its index and the reason, and
            counted in :meth:`stats`.
        max_errors: With ``errors="skip"``, the items an epoch may drop: a count, or a
            fraction of the epoch's items; one more raises :class:`SkipBudgetExceeded`
            listing the first failures. ``None``: no limit.

    Raises:
        TypeError: A setting has the wrong type, or the dataset is not a map-style dataset.
        ValueError: A setting is out of range, or ``sampler`` is given with ``shuffle``.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool | None = False,
        sampler: object = None,
        *,
        seed: int | None = None,
        drop_last: bool = False,
        transform: Transform | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        item_concurrency: int = 1,
        prefetch_depth: int = 2,
        cpu_threads: int | None = None,
        timeout: float | None = None,
        pin_memory: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        errors: str = "raise",
        max_errors: int | float | None = None,
    ) -> None:
        self._settings = Settings.build(
            batch_size=batch_size,
            drop_last=drop_last,
            num_workers=num_workers,
            item_concurrency=item_concurrency,
            prefetch_depth=prefetch_depth,
            cpu_threads=cpu_threads,
            timeout=timeout,
            pin_memory=pin_memory,
        )
        self._shuffle = False if shuffle is None else check_bool("shuffle", shuffle)
        _check_callable("transform", transform)
        _check_callable("collate_fn", collate_fn)
        self._seed_given = seed is not None
        self._seed = secrets.randbits(63) if seed is None else check_int("seed", seed, 0)
        self._rank, self._world_size = resolve_ranks(rank, world_size)
        self._owns_sampler = sampler is None
        if sampler is not None:
            if shuffle:
                raise ValueError("sampler and shuffle=True are exclusive; pass one of them")
            if not isinstance(sampler, Sampler) and not hasattr(sampler, "__iter__"):
                raise TypeError(f"sampler must be an iterable of int, got {sampler!r}")
            self._sampler: object = sampler
        else:
            self._sampler = self._default_sampler()
        self._is_async = is_async_dataset(dataset)
        self._dataset = dataset
        self._transform = transform
        collate = default_collate if collate_fn is None else collate_fn
        if self._settings.pin_memory and pinning_available():
            self._collate: Callable[[list[Any]], Any] = lambda items: pin_batch(collate(items))
        else:
            self._collate = collate
        self._max_errors = check_errors(errors, max_errors)
        self._skip = errors == "skip"
        self._recorder = Recorder(self._settings.requests_in_flight, self._settings.cpu_threads)
        self._epoch = 0
        self._progress: Progress | None = None
        self._resume: Resume | None = None
        self._skipper: Skipper | None = None
        self._sampler_state_at_start: Any = None
        self._runtime: Runtime | None = None

    def _default_sampler(self) -> Sampler:
        if self._world_size > 1:
            return DistributedSampler(
                self._world_size,
                self._rank,
                shuffle=self._shuffle,
                seed=self._seed,
                drop_last=self._settings.drop_last,
            )
        return RandomSampler(self._seed) if self._shuffle else SequentialSampler()

    # -- the settings, read-only ------------------------------------------------------------

    @property
    def dataset(self) -> Any:
        """The dataset."""
        return self._dataset

    @property
    def sampler(self) -> object:
        """The sampler that orders each epoch."""
        return self._sampler

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return self._settings.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether a short last batch is dropped."""
        return self._settings.drop_last

    @property
    def num_workers(self) -> int:
        """Batches processed at once."""
        return self._settings.num_workers

    @property
    def item_concurrency(self) -> int:
        """Items of one batch fetched at once."""
        return self._settings.item_concurrency

    @property
    def prefetch_depth(self) -> int:
        """Finished batches that may wait for the consumer."""
        return self._settings.prefetch_depth

    @property
    def seed(self) -> int:
        """The seed of shuffling and of random transforms."""
        return self._seed

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks sharing each epoch."""
        return self._world_size

    @property
    def epoch(self) -> int:
        """The number of the epoch the next iteration runs (0 for the first)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run epoch ``epoch`` (its order is drawn from it).

        A loaded state still applies if its epoch is the one that runs next; an epoch left
        unfinished is forgotten, so :meth:`state_dict` then names epoch ``epoch``.
        """
        self._epoch = check_int("epoch", epoch, 0)
        self._progress = None

    # -- statistics ---------------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """Per-stage statistics since the loader was built (or :meth:`reset_stats`)."""
        return self._recorder.snapshot()

    def reset_stats(self) -> None:
        """Count the statistics from zero again."""
        self._recorder.reset()

    # -- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The loader's position, as a small JSON-serialisable dict.

        It counts the batches the consumer received (a failed batch too), never the ones
        merely prefetched. Between epochs it names the next epoch with 0 batches received.
        """
        progress = self._progress
        if progress is not None and not progress.done:
            epoch, received, custom = (
                progress.epoch,
                progress.received,
                self._sampler_state_at_start,
            )
        else:
            epoch, received = self._epoch, 0
            custom = self._custom_sampler_state()
        return {
            "format": FORMAT,
            "epoch": epoch,
            "batches_received": received,
            "seed": self._seed,
            "dataset_length": len(self._dataset),
            "batch_size": self._settings.batch_size,
            "drop_last": self._settings.drop_last,
            "world_size": self._world_size,
            "rank": self._rank,
            "sampler": sampler_state(self._sampler, custom),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next epoch yields the batches it had not yet handed over.

        Loaded by a different number of ranks than saved it, the epoch continues elastically:
        this rank gets its share of the samples that no rank had received.

        Raises:
            ValueError: The state comes from an incompatible loader (another format, dataset
                length, batch size, ``drop_last`` or sampler order); the message says which.
        """
        if not isinstance(state, dict):
            raise ValueError(f"a loader state is a dict, got {type(state).__name__}")
        saved_seed = state.get("seed")
        if self._owns_sampler and not self._seed_given and isinstance(saved_seed, int):
            # The seed was drawn from the OS: adopt the saved one, so the order is the same.
            self._seed = saved_seed
            self._sampler = self._default_sampler()
        check_compatible(state, self._describe())
        saved_sampler = state["sampler"]
        if saved_sampler.get("kind") == "custom":
            self._sampler.load_state_dict(saved_sampler["state"])  # type: ignore[attr-defined]
        order = order_of(self._sampler) or (False, 0)
        self._epoch = state["epoch"]
        self._progress = None
        self._resume = Resume(
            epoch=state["epoch"],
            batches=state["batches_received"],
            world_size=state["world_size"],
            shuffle=order[0],
            seed=order[1],
        )

    def _describe(self) -> dict[str, Any]:
        return {
            "dataset_length": len(self._dataset),
            "batch_size": self._settings.batch_size,
            "drop_last": self._settings.drop_last,
            "sampler": sampler_state(self._sampler, None),
        }

    def _custom_sampler_state(self) -> Any:
        if isinstance(self._sampler, Sampler):
            return None
        get_state = getattr(self._sampler, "state_dict", None)
        return get_state() if callable(get_state) else None

    def __len__(self) -> int:
        """The number of batches per epoch (PyTorch's convention).

        Raises:
            TypeError: The sampler has no ``__len__``.
        """
        samples = sampler_length(self._sampler, len(self._dataset))
        return batch_count(samples, self._settings.batch_size, self._settings.drop_last)

    # -- epochs -----------------------------------------------------------------------------

    def _start_epoch(self) -> tuple[Batches, Progress]:
        """Fix the batches of the next epoch (the sampler is read whole, now).

        After a loaded state, the batches already received are left out, never fetched.
        """
        epoch, length = self._epoch, len(self._dataset)
        resume, self._resume = self._resume, None
        if resume is not None and resume.epoch != epoch:
            resume = None
        skip = 0
        indices: Sequence[int]
        if resume is not None and resume.world_size != self._world_size:
            indices = self._elastic_indices(resume, length)
        else:
            self._sampler_state_at_start = self._custom_sampler_state()
            indices = read_sampler(self._sampler, length, epoch)
            skip = resume.batches if resume is not None else 0
        batches = cut_batches(indices, self._settings.batch_size, self._settings.drop_last)
        self._epoch = epoch + 1
        progress = Progress(epoch, received=min(skip, len(batches)))
        self._progress = progress
        self._skipper = (
            Skipper(epoch_budget(self._max_errors, batches.items), self._recorder)
            if self._skip
            else None
        )
        return batches[skip:], progress

    def _elastic_indices(self, resume: Resume, length: int) -> list[int]:
        order = order_of(self._sampler)
        if order is None:
            raise ValueError(
                f"a state saved by {resume.world_size} ranks can only be loaded by "
                f"{self._world_size} with a built-in sampler"
            )
        shared = (
            self._sampler.global_order(length, resume.epoch)
            if isinstance(self._sampler, DistributedSampler)
            else read_sampler(self._sampler, length, resume.epoch)
        )
        return elastic_indices(
            shared,
            resume.world_size,
            resume.batches * self._settings.batch_size,
            self._world_size,
            self._rank,
            self._settings.drop_last,
        )

    def _runtime_here(self) -> Runtime:
        # After fork() the inherited threads do not exist: build new ones, leave the old alone.
        if self._runtime is None or self._runtime.pid != os.getpid():
            close = getattr(self._dataset, "aclose", None) if self._is_async else None
            self._runtime = Runtime(
                self._settings.cpu_threads,
                self._settings.requests_in_flight,
                closers=[close] if close is not None else [],
            )
        return self._runtime

    def _work(self, runtime: Runtime, epoch: int) -> Work:
        return Work(
            source=Source(self._dataset, None if self._is_async else runtime.io),
            transform=self._transform,
            collate=self._collate,
            cpu=runtime.cpu,
            batch_tasks=self._settings.batch_tasks,
            item_concurrency=self._settings.item_concurrency,
            recorder=self._recorder,
            skipper=self._skipper,
            augment=(self._seed, epoch),
        )

    def _iterate(self, with_indices: bool) -> DirectIterator | ThreadedIterator:
        settings = self._settings
        batches, progress = self._start_epoch()
        # The direct path cannot stop a batch that outlasts `timeout`: with one, the epoch
        # runs on the loop thread, whose hand-off honours it.
        direct = not self._is_async and settings.num_workers == 0 and settings.timeout is None
        if direct and settings.item_concurrency == 1:
            return DirectIterator(
                self._dataset,
                batches,
                self._transform,
                self._collate,
                with_indices,
                progress,
                self._recorder,
                self._skipper,
                (self._seed, progress.epoch),
            )
        runtime = self._runtime_here()
        return ThreadedIterator(
            runtime,
            self._work(runtime, progress.epoch),
            batches,
            settings.prefetch_depth,
            settings.timeout,
            with_indices,
            progress,
        )

    def _aiterate(self, with_indices: bool) -> AsyncIterator:
        batches, progress = self._start_epoch()
        return AsyncIterator(
            self._work(self._runtime_here(), progress.epoch),
            batches,
            self._settings.prefetch_depth,
            self._settings.timeout,
            with_indices,
            progress,
        )

    def __iter__(self) -> Iterator[Any]:
        """Run one epoch; yield its batches in order."""
        return self._iterate(with_indices=False)

    def __aiter__(self) -> AsyncIteratorABC[Any]:
        """Run one epoch on the running event loop; yield its batches in order."""
        return self._aiterate(with_indices=False)

    def iter_with_indices(self) -> Iterator[tuple[list[int], Any]]:
        """Run one epoch; yield ``(indices, batch)`` pairs in order."""
        return self._iterate(with_indices=True)

    def aiter_with_indices(self) -> AsyncIteratorABC[tuple[list[int], Any]]:
        """Run one epoch on the running event loop; yield ``(indices, batch)`` pairs."""
        return self._aiterate(with_indices=True)

    # -- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Await an async dataset's ``aclose()`` (bounded, on the loader's loop thread) and
        stop the loader's threads; after ``for`` or ``async for`` use alike.

        Idempotent. A later iteration starts new threads.
        """
        self._stop_runtime(dataset_closed=False)

    async def aclose(self) -> None:
        """Await an async dataset's ``aclose()`` on the running loop, then stop the threads."""
        close = getattr(self._dataset, "aclose", None) if self._is_async else None
        if close is not None and self._runtime is not None:
            try:
                await asyncio.wait_for(close(), CLOSE_TIMEOUT_S)
            except Exception:
                logger.exception("%s.aclose() failed", type(self._dataset).__name__)
        self._stop_runtime(dataset_closed=True)

    def _stop_runtime(self, dataset_closed: bool) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None and runtime.pid == os.getpid():
            runtime.close(run_closers=not dataset_closed)

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> DataLoader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        s = self._settings
        return (
            f"DataLoader({type(self._dataset).__name__}, batch_size={s.batch_size}, "
            f"num_workers={s.num_workers}, item_concurrency={s.item_concurrency}, "
            f"prefetch_depth={s.prefetch_depth})"
        )
