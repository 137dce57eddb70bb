"""Per-stage statistics: where an epoch's time goes, and what to change.

A :class:`Recorder` is filled as the loader works (cheaply: a clock read and a few additions
per item), and :meth:`Recorder.snapshot` turns it into a frozen :class:`LoaderStats`, whose
:meth:`~LoaderStats.report` names the bottleneck and the setting to change.
"""

from __future__ import annotations

import contextvars
import mmap
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Final, Literal

from ._cpus import available_cpus

_SAMPLES: Final = 4096
"""Durations kept per stage for the percentiles (the most recent ones)."""
_RECENT: Final = 31
"""Runs whose median is a stage's typical duration (odd: one middle run)."""

current: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "asyncloader_recorder", default=None
)
"""The recorder of the epoch whose code is running (seen by the datasets' retry loops and
the shards' readers)."""


def note_retry() -> None:
    """Count one retry in the statistics of the epoch that runs this code, if any."""
    recorder = current.get()
    if recorder is not None:
        recorder.add_retry()


def note_bytes(count: int) -> None:
    """Count ``count`` bytes of a shard read in the statistics of the epoch that runs this
    code, if any: a shard's items are samples, not the bytes they came in."""
    recorder = current.get()
    if recorder is not None:
        recorder.add_bytes(count)


Tally = tuple[list[float], list[float], list[float], int, int, int, float]
"""What one job of a worker process recorded: its fetch, transform and collate durations,
items, bytes, retries and the transform's CPU seconds."""

Stage = Literal["fetch", "transform", "collate", "permit_wait", "consumer_wait"]
"""A stage the recorder times."""


@dataclass(frozen=True)
class StageStats:
    """One stage's timings: how often it ran and how long it took.

    Attributes:
        count: Times it ran.
        total_s: Seconds, all runs together.
        mean_s: Seconds per run.
        p50_s: Median seconds per run (over the most recent 4,096 runs).
        p99_s: 99th percentile seconds per run (same runs).
    """

    count: int = 0
    total_s: float = 0.0
    mean_s: float = 0.0
    p50_s: float = 0.0
    p99_s: float = 0.0


class _Timing:
    __slots__ = ("_typical_at", "count", "samples", "total", "typical")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.samples: deque[float] = deque(maxlen=_SAMPLES)
        self.typical: float | None = None
        """The median of the most recent runs (``None`` before the first): the figure the
        loader's where-to-run decisions read, which one slow run (a new thread's first, a
        preempted one) cannot hold up for long as it holds up the mean. Refreshed by the
        writer, which holds the recorder's lock: a reader on any thread reads one float."""
        self._typical_at = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.samples.append(seconds)
        if self.count >= self._typical_at:
            self._refresh()

    def add_all(self, durations: list[float]) -> None:
        self.count += len(durations)
        self.total += sum(durations)
        self.samples.extend(durations)
        if self.count >= self._typical_at:
            self._refresh()

    def _refresh(self) -> None:
        # After every run while there are fewer than _RECENT, then every _RECENT runs: a
        # sort of a few dozen floats now and then, not per run.
        recent = sorted(islice(reversed(self.samples), _RECENT))
        self.typical = recent[len(recent) // 2] if recent else None
        self._typical_at = self.count + (1 if self.count < _RECENT else _RECENT)

    def snapshot(self) -> StageStats:
        if not self.count:
            return StageStats()
        ordered = sorted(self.samples)
        return StageStats(
            count=self.count,
            total_s=self.total,
            mean_s=self.total / self.count,
            p50_s=ordered[len(ordered) // 2],
            p99_s=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        )


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of a loader's statistics since it was built (or last reset).

    Attributes:
        fetch: Dataset calls (one per item, or one per batch when a batch is one call). An
            item fetched on its own is counted here, in ``items`` and in ``bytes`` once none
            of its batch's items is left in work (a failed fetch at once).
        transform: Transform calls, one per item.
        collate: Collate calls, one per batch.
        permit_wait: The driver's waits for room in the window that began while a finished
            batch waited for the consumer (the consumer is slower).
        consumer_wait: The consumer's waits for its next batch (the loader is slower).
        items: Items fetched.
        batches: Batches handed to the consumer (failed ones included).
        bytes: Bytes of the bytes-like items fetched (the built-in datasets' items); for
            ``TarShards`` and ``ParquetShards``, the bytes of their shards read, as they
            came (a compressed shard's compressed bytes).
        retries: Retries made by the built-in datasets.
        errors: Batches that failed.
        skipped: Items dropped by ``errors="skip"``.
        in_flight: Dataset calls in flight now.
        peak_in_flight: The most dataset calls in flight at once.
        items_in_flight: Items being fetched now (a whole-batch call fetches many).
        peak_items_in_flight: The most items fetched at once.
        active_s: Seconds epochs were running.
        requests_limit: ``max(num_workers, 1) * item_concurrency`` (1 for a stream: one
            reader).
        cpu_threads: Threads of the CPU pool (with ``cpu_processes``, the processes).
        stream: Whether the dataset is a stream (read by one reader, in order).
        transform_cpu_s: CPU seconds the transform used (its threads' own, not the time they
            waited): next to ``transform.total_s`` it shows whether threads ran it at once.
        cpu_processes: Worker processes of the CPU stage (0: threads).
        interleave: Shards a shard stream (``TarShards``, ``ParquetShards``) reads at once;
            0 for any other dataset.
        shards: The shards of a shard stream, of every rank; 0 for any other dataset.
        inline: Whether the batches were made inline, in the consumer's thread inside
            ``next()``, with no thread or queue (``num_workers=0`` and a sync map-style
            dataset).
    """

    fetch: StageStats = field(default_factory=StageStats)
    transform: StageStats = field(default_factory=StageStats)
    collate: StageStats = field(default_factory=StageStats)
    permit_wait: StageStats = field(default_factory=StageStats)
    consumer_wait: StageStats = field(default_factory=StageStats)
    items: int = 0
    batches: int = 0
    bytes: int = 0
    retries: int = 0
    errors: int = 0
    skipped: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    items_in_flight: int = 0
    peak_items_in_flight: int = 0
    active_s: float = 0.0
    requests_limit: int = 1
    cpu_threads: int = 1
    stream: bool = False
    transform_cpu_s: float = 0.0
    cpu_processes: int = 0
    interleave: int = 0
    shards: int = 0
    inline: bool = False

    def gil_bound(self) -> bool:
        """Whether the transform holds the GIL so that more threads cannot speed it up: it
        computes (a good part of its time on the CPU), yet all the CPU threads together give
        it about one core. A transform that waits (on I/O, a sleep) uses little CPU, and
        one that releases the GIL (NumPy, Pillow's decoders) gets more than a core."""
        if self.cpu_processes or self.cpu_threads < 2 or available_cpus() < 2:
            return False  # (on one CPU, threads get one core whatever the work)
        if self.active_s <= 0 or self.transform.total_s <= 0:
            return False
        computing = self.transform_cpu_s / self.transform.total_s
        cores = self.transform_cpu_s / self.active_s
        # Between one that holds the GIL (about one core, on the CPU when not waiting for
        # the GIL) and one that releases it (more), as measured in docs/processes.md.
        return computing >= 0.3 and 0.5 <= cores <= 1.15

    def bottleneck(self) -> tuple[str, str]:
        """``(stage, advice)``: what limits the loader, and the setting to change."""
        active = max(self.active_s, 1e-9)
        if self.batches == 0:
            if self.skipped:  # a batch of none is passed over, not handed on empty
                return "skip", (
                    f'errors="skip" dropped {self.skipped} items, and no batch was handed '
                    'over yet; the "asyncloader" logger says why each failed'
                )
            return "idle", "no batch was handed over yet"
        # The consumer waited for batches (consumer_wait) for part of the time; the rest it
        # spent on its own work. Mostly its own work: the loader keeps up, the consumer limits.
        if self.consumer_wait.total_s / active < 0.5:
            return "consumer", "the loader waits on you; the training step is the bottleneck"
        if self.inline:  # no thread of the loader ran any of it: no stage to tune but that
            stage = max(
                ("fetch", self.fetch.total_s),
                ("transform", self.transform.total_s),
                ("collate", self.collate.total_s),
                key=lambda pair: pair[1],
            )[0]
            return "inline", (
                "num_workers=0 makes each batch in your thread, inside next() "
                f"({self.consumer_wait.mean_s * 1000:.2f} ms a batch, most of it {stage}): "
                "set num_workers to make the batches on the loader's threads while you train"
            )
        # Otherwise the busiest resource limits: the request slots or the CPU pool.
        fetch_busy = self.fetch.total_s / (active * self.requests_limit)
        cpu = max(1, self.cpu_threads)
        transform_busy = self.transform.total_s / (active * cpu)
        collate_busy = self.collate.total_s / (active * cpu)
        stage = max(
            ("fetch", fetch_busy),
            ("transform", transform_busy),
            ("collate", collate_busy),
            key=lambda pair: pair[1],
        )[0]
        if stage == "fetch" and 0 < self.shards <= self.interleave:
            return "fetch", (
                f"the shards' reader takes {self.fetch.mean_s * 1000:.2f} ms a batch, and all "
                f"{self.shards} shards are read at once (interleave={self.interleave}): their "
                "storage or their parsing is the bound, and more interleave would open no "
                "more; data in more shards can be read more at once"
            )
        if stage == "fetch" and self.interleave:
            return "fetch", (
                f"the shards' reader takes {self.fetch.mean_s * 1000:.2f} ms a batch from "
                f"interleave={self.interleave} shards; raise interleave while their storage's "
                "latency is the bound (tar shards are parsed on the event loop's thread, "
                "Parquet shards decoded on the shards' threads)"
            )
        if stage == "fetch" and self.stream:
            return "fetch", (
                f"one reader pulls the stream, {self.fetch.mean_s * 1000:.2f} ms a batch; make "
                "its iterator faster, or store the data in shards (TarShards, ParquetShards) "
                "and raise interleave"
            )
        if stage == "fetch" and self.peak_in_flight < self.requests_limit:
            return "fetch", (
                f"{self.peak_in_flight} of {self.requests_limit} requests in flight at peak, "
                f"p99 {self.fetch.p99_s * 1000:.0f} ms: they were never all in use (too few "
                "items in the batches ahead, or the event loop's thread is busy), so raising "
                "item_concurrency or num_workers would not help"
            )
        if stage == "fetch":
            return "fetch", (
                f"{self.peak_in_flight} requests in flight at peak, p99 "
                f"{self.fetch.p99_s * 1000:.0f} ms; raise item_concurrency or num_workers"
            )
        if stage == "transform" and self.gil_bound():
            return "GIL", (
                f"the transform holds the GIL: {self.cpu_threads} CPU threads give it "
                f"{self.transform_cpu_s / active:.1f} cores; run it in worker processes "
                f"(cpu_processes={self.cpu_threads} instead of cpu_threads)"
            )
        if stage == "transform":
            return "transform", (
                f"{self.transform.mean_s * 1000:.2f} ms per item on {cpu} CPU threads; "
                "raise cpu_threads or make the transform cheaper"
            )
        return "collate", (
            f"{self.collate.mean_s * 1000:.2f} ms per batch; use a cheaper collate_fn or "
            "smaller batches"
        )

    def report(self) -> str:
        """A short table of the stages and a line naming the bottleneck."""
        lines = [
            f"{'stage':<14}{'count':>9}{'total s':>10}{'mean ms':>10}{'p50 ms':>9}{'p99 ms':>9}"
        ]
        for name in ("fetch", "transform", "collate", "permit_wait", "consumer_wait"):
            row: StageStats = getattr(self, name)
            lines.append(
                f"{name:<14}{row.count:>9}{row.total_s:>10.3f}{row.mean_s * 1e3:>10.3f}"
                f"{row.p50_s * 1e3:>9.3f}{row.p99_s * 1e3:>9.3f}"
            )
        lines.append(
            f"items {self.items}, batches {self.batches}, {self.bytes / 2**20:.1f} MiB, "
            f"retries {self.retries}, errors {self.errors}, skipped {self.skipped}, "
            f"requests in flight {self.in_flight} (peak {self.peak_in_flight} of "
            f"{self.requests_limit}), items in flight peak {self.peak_items_in_flight}"
        )
        limit, advice = self.bottleneck()
        lines.append(f"{limit}-bound: {advice}")
        return "\n".join(lines)


def item_bytes(item: object) -> int:
    """The bytes of a bytes-like item (the built-in datasets'), else 0."""
    return len(item) if _is_bytes_like(item) else 0  # type: ignore[arg-type]


def _is_bytes_like(item: object) -> bool:
    # obstore's Bytes is matched by name, so that obstore need not be imported.
    return isinstance(item, _BYTES_LIKE) or type(item).__name__ == "Bytes"


_BYTES_LIKE: Final = (bytes, bytearray, memoryview, mmap.mmap)


def fetched_bytes(items: list[Any]) -> int:
    """The bytes of a batch of bytes-like items (the built-in datasets'), else 0.

    Only the first item's type is looked at, so other items (arrays, tensors, objects) cost
    nothing to count: the statistics stay on by default.
    """
    if not items or not _is_bytes_like(items[0]):
        return 0
    return sum(len(item) if _is_bytes_like(item) else 0 for item in items)


class Recorder:
    """The mutable counters behind :class:`LoaderStats`; safe to update from any thread."""

    def __init__(
        self,
        requests_limit: int,
        cpu_threads: int,
        stream: bool = False,
        processes: int = 0,
        interleave: int = 0,
        shards: int = 0,
    ) -> None:
        self.requests_limit = requests_limit
        self.cpu_threads = cpu_threads
        self.stream = stream
        self.processes = processes
        self.interleave = interleave
        self.shards = shards
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Start counting again from zero."""
        with self._lock:
            self.fetch, self.transform, self.collate = _Timing(), _Timing(), _Timing()
            self.permit_wait, self.consumer_wait = _Timing(), _Timing()
            self.items = self.batches = self.bytes = self.retries = 0
            self.errors = self.skipped = self.in_flight = self.peak_in_flight = 0
            self.items_in_flight = self.peak_items_in_flight = 0
            self.active_s = 0.0
            self.transform_cpu = 0.0
            self.inline = False
            self._active = 0
            self._active_since = 0.0

    def fetch_started(self, items: int) -> float:
        """One dataset call for ``items`` items begins; returns its start time."""
        self.calls_started(1, items)
        return time.perf_counter()

    def fetch_done(self, started: float, items: list[Any] | None, requested: int) -> None:
        """The call begun at ``started`` for ``requested`` items ended (``items``: its result)."""
        size = fetched_bytes(items) if items is not None else 0
        self._call_ended(started, requested, 0 if items is None else len(items), size)

    def item_done(self, started: float, item: Any) -> None:
        """One item's call begun at ``started`` returned ``item``: :meth:`fetch_done` for
        one item, without building a list (it runs once per item on the loop thread)."""
        self._call_ended(started, 1, 1, item_bytes(item))

    def calls_started(self, calls: int, items: int) -> None:
        """``calls`` dataset calls for ``items`` items began (negative: ended), counted in
        flight now and at peak; their time is recorded elsewhere."""
        with self._lock:
            self.in_flight += calls
            self.items_in_flight += items
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            self.peak_items_in_flight = max(self.peak_items_in_flight, self.items_in_flight)

    def lanes_busy(self, lanes: int) -> None:
        """``lanes`` lanes began fetching, one item at a time (negative: went idle). A lane
        that goes from one item to the next counts once, so this runs on a lane's way in and
        out of work, not per item."""
        self.calls_started(lanes, lanes)

    def lane_items(self, durations: list[float], sizes: list[int]) -> None:
        """Items that lanes fetched, each in its duration, of these sizes in bytes (0: not
        bytes-like): a batch's, counted once it has ended."""
        with self._lock:
            self.fetch.add_all(durations)
            self.items += len(durations)
            self.bytes += sum(sizes)

    def _call_ended(self, started: float, requested: int, fetched: int, size: int) -> None:
        elapsed = time.perf_counter() - started
        with self._lock:
            self.in_flight -= 1
            self.items_in_flight -= requested
            self.fetch.add(elapsed)
            self.items += fetched
            self.bytes += size

    def record_direct_batch(
        self,
        fetch_s: float,
        items: list[Any] | None,
        requested: int,
        collate_s: float | None,
        wait_s: float,
        handed: bool = True,
    ) -> None:
        """One batch of the direct path, in one update (its cost is paid per batch);
        ``handed``: not passed over (every item skipped)."""
        size = fetched_bytes(items) if items is not None else 0
        with self._lock:
            self.inline = True
            self.peak_in_flight = max(self.peak_in_flight, 1)
            self.peak_items_in_flight = max(self.peak_items_in_flight, requested)
            self.fetch.add(fetch_s)
            if items is not None:
                self.items += len(items)
                self.bytes += size
            if collate_s is not None:
                self.collate.add(collate_s)
            self.consumer_wait.add(wait_s)
            self.batches += handed
            self.errors += collate_s is None

    def add(self, stage: Stage, seconds: float) -> None:
        with self._lock:
            getattr(self, stage).add(seconds)

    def add_many(self, stage: Stage, durations: list[float]) -> None:
        if not durations:
            return
        with self._lock:
            timing: _Timing = getattr(self, stage)
            timing.add_all(durations)

    def tally(self) -> Tally:
        """What this recorder holds, to be merged into another (a worker process's job)."""
        with self._lock:
            return (
                list(self.fetch.samples),
                list(self.transform.samples),
                list(self.collate.samples),
                self.items,
                self.bytes,
                self.retries,
                self.transform_cpu,
            )

    def merge(self, tally: Tally) -> None:
        """Add what a worker process's job recorded."""
        fetches, transforms, collates, items, size, retries, transform_cpu = tally
        with self._lock:
            for timing, durations in (
                (self.fetch, fetches),
                (self.transform, transforms),
                (self.collate, collates),
            ):
                for seconds in durations:
                    timing.add(seconds)
            self.items += items
            self.bytes += size
            self.retries += retries
            self.transform_cpu += transform_cpu

    def add_transform_cpu(self, seconds: float) -> None:
        """The transform used ``seconds`` of its thread's CPU time."""
        with self._lock:
            self.transform_cpu += seconds

    def add_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def add_bytes(self, count: int) -> None:
        with self._lock:
            self.bytes += count

    def add_batch(self, failed: bool) -> None:
        with self._lock:
            self.batches += 1
            self.errors += failed

    def add_skipped(self, count: int) -> None:
        with self._lock:
            self.skipped += count

    def epoch_started(self) -> None:
        with self._lock:
            if self._active == 0:
                self._active_since = time.perf_counter()
            self._active += 1

    def epoch_ended(self) -> None:
        with self._lock:
            if self._active == 0:
                return
            self._active -= 1
            if self._active == 0:
                self.active_s += time.perf_counter() - self._active_since

    def snapshot(self) -> LoaderStats:
        """The statistics now, as a frozen value."""
        with self._lock:
            active = self.active_s
            if self._active:
                active += time.perf_counter() - self._active_since
            return LoaderStats(
                fetch=self.fetch.snapshot(),
                transform=self.transform.snapshot(),
                collate=self.collate.snapshot(),
                permit_wait=self.permit_wait.snapshot(),
                consumer_wait=self.consumer_wait.snapshot(),
                items=self.items,
                batches=self.batches,
                bytes=self.bytes,
                retries=self.retries,
                errors=self.errors,
                skipped=self.skipped,
                in_flight=self.in_flight,
                peak_in_flight=self.peak_in_flight,
                items_in_flight=self.items_in_flight,
                peak_items_in_flight=self.peak_items_in_flight,
                active_s=active,
                requests_limit=self.requests_limit,
                cpu_threads=self.cpu_threads,
                stream=self.stream,
                transform_cpu_s=self.transform_cpu,
                cpu_processes=self.processes,
                interleave=self.interleave,
                shards=self.shards,
                inline=self.inline,
            )
