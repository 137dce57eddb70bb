"""The walk through an epoch's shards (``TarShards``, and ``ParquetShards`` in :mod:`._parquet`).

Each epoch orders the shards (permuted by ``(seed, epoch)`` with ``shuffle=True``), gives every
rank its share, and reads ``interleave`` of them at once: each shard with one streaming read
(the ``stream`` method of the dataset that locates the shards) by a task of its own, parsed on
the event loop as its chunks arrive (:mod:`._tar`), at most ``buffer`` samples ahead; the next
``interleave`` shards are already requested, so that a shard's end does not stall the turn.
Samples are taken from the open shards in turn, a fixed round-robin, and a shard that ends
gives its turn to the next shard in the order, so the samples' order depends only on the
shards, the seed, the epoch and ``interleave``: never on ``num_workers`` or timing. A shard
that fails (cannot be opened, is not a tar, ends early, has a bad member) yields one
:class:`~asyncloader.SampleError` naming it and the member, in its place in the order, and the
epoch goes on with the next shard.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Protocol

import numpy as np

from .._pool import ThreadPool
from .._settings import check_bool, check_int
from .._stats import note_bytes
from .._stream import SampleError, StreamInfo, stream_info
from ._http import _check_max_bytes
from ._redact import redact_url
from ._streaming import Blocking, Sink
from ._tar import ShardError, TarParser
from ._walk import Walk, check_walk, draw, regroup

_END: Final = object()


class ShardSource(Protocol):
    """Where the shards are: a :class:`FileDataset`, :class:`HttpDataset` or
    :class:`ObjectStoreDataset` whose items are the shards."""

    def __len__(self) -> int: ...

    async def stream(self, index: int, sink: Sink, blocking: Blocking) -> None: ...


def _name(source: Any, index: int) -> str:
    try:
        return redact_url(str(source.locations[index]))
    except Exception:  # a location that cannot be rendered fails when it is opened
        return f"#{index}"


class _Stop(Exception):
    """The parser found a fault, or the archive's end: the rest of the shard is not read."""


class Shard:
    """One shard being read by a task of its own (its format's producer), at most ``buffer``
    samples ahead of the round-robin, which takes them with :meth:`next`.

    Args:
        name: How messages name the shard.
        buffer: Samples read ahead (then :meth:`room` waits).
        skip: Samples (and faults) to drop first: those a resumed walk had taken.
        produce: Reads the shard: :meth:`put` each sample in order, awaiting :meth:`room`.
    """

    def __init__(
        self,
        name: str,
        buffer: int,
        skip: int,
        produce: Callable[[Shard], Awaitable[None]],
        keep: list[int] | None = None,
    ) -> None:
        self.name = name
        self._buffer = buffer
        self._skip = skip
        self._keep = None if keep is None else frozenset(keep)
        self._place = 0  # of the next sample the producer puts
        self._items: deque[Any] = deque()
        self._done = False
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(produce), name=f"asyncloader shard {name}"
        )

    async def next(self) -> Any:
        """The shard's next sample (or :class:`SampleError`), or ``_END``."""
        while not self._items:
            if self._done:
                return _END
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if len(self._items) < self._buffer:
            self._room.set()
        return item

    def cancel(self) -> None:
        """Stop reading: the request in flight is cancelled."""
        self._task.cancel()

    def put(self, item: Any) -> None:
        """The shard's next sample (or fault), from its producer."""
        place, self._place = self._place, self._place + 1
        if self._keep is not None and place not in self._keep:
            return
        if self._skip:
            self._skip -= 1
            return
        self._items.append(item)
        self._ready.set()

    def put_all(self, items: list[Any]) -> None:
        """:meth:`put` each of ``items``, in order (a chunk's samples)."""
        if self._keep is not None or self._skip:
            for item in items:
                self.put(item)
        elif items:
            self._place += len(items)
            self._items.extend(items)
            self._ready.set()

    def skip_ahead(self, count: int) -> bool:
        """Drop ``count`` samples unread if all of them are still to be skipped (a resumed
        walk's whole row group, say); whether they were."""
        if self._keep is not None or self._skip < count:
            return False
        self._skip -= count
        return True

    async def room(self) -> None:
        """Wait until fewer than ``buffer`` samples wait to be taken."""
        while len(self._items) >= self._buffer:
            self._room.clear()
            await self._room.wait()

    async def _run(self, produce: Callable[[Shard], Awaitable[None]]) -> None:
        try:
            await produce(self)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # it could not be opened, or its data stopped coming
            fault = error if isinstance(error, ShardError) else None
            self.put(SampleError(fault or ShardError(f"shard {self.name}: {error}")))
        self._done = True
        self._ready.set()


def tar_producer(
    source: ShardSource, index: int, max_bytes: int | None, blocking: Blocking
) -> Callable[[Shard], Awaitable[None]]:
    """Stream a tar shard and parse it as its chunks come (:class:`._tar.TarParser`)."""

    async def produce(shard: Shard) -> None:
        parser = TarParser(shard.name, max_bytes)

        async def sink(chunk: Any) -> None:
            note_bytes(len(chunk))
            # A compressed chunk's samples come a step at a time, each step once there is
            # room for it: a chunk of a few KiB can inflate to many MiB of samples.
            for samples in parser.feed(chunk):
                shard.put_all(samples)
                # A stream that goes on past the archive's end is not read to its end, which
                # may never come (tarfile's stream mode stops there too).
                if parser.error is not None or parser.ended:
                    raise _Stop
                await shard.room()

        try:
            await source.stream(index, sink, blocking)
        except _Stop:
            pass
        else:
            shard.put_all(parser.close())
        if parser.error is not None:
            raise parser.error

    return produce


class ShardStream:
    """The walk through an epoch's shards that every shard format shares: order, ranks,
    the round-robin of the open shards, the shuffle buffer, the state (see the module
    docstring). A format says how one shard is read (:meth:`_producer`).

    Args:
        shards: The dataset whose items are the shards.
        interleave, shuffle, shuffle_buffer, buffer, length: As :class:`TarShards` says.
    """

    reads_with = "stream"
    """The method a format reads a shard with, which the shards' dataset must have."""

    def __init__(
        self,
        shards: Any,
        *,
        interleave: int,
        shuffle: bool,
        shuffle_buffer: int,
        buffer: int,
        length: int | None,
    ) -> None:
        method = self.reads_with
        if not callable(getattr(shards, method, None)) or not hasattr(shards, "__len__"):
            raise TypeError(
                "shards must be a FileDataset, HttpDataset or ObjectStoreDataset (a dataset "
                f"with {method} and __len__), got {type(shards).__name__}"
            )
        self.shards = shards
        self.interleave = check_int("interleave", interleave, 1)
        self.shuffle = check_bool("shuffle", shuffle)
        self.shuffle_buffer = check_int("shuffle_buffer", shuffle_buffer, 0)
        self.buffer = check_int("buffer", buffer, 1)
        self.length = None if length is None else check_int("length", length, 0)
        self._walk: Walk | None = None
        self._loaded: Walk | None = None

    def _producer(self, index: int, blocking: Blocking) -> Callable[[Shard], Awaitable[None]]:
        raise NotImplementedError

    def __len__(self) -> int:
        """The ``length`` given: the samples a rank reads in an epoch, as its user says.

        Raises:
            TypeError: No ``length`` was given (the loader then has no ``len()``, as in
                torch for a stream without one).
        """
        if self.length is None:
            raise TypeError(
                f"{type(self).__name__} has no length: pass length= (the samples each rank "
                "reads in an epoch) to give it and its loader a len()"
            )
        return self.length

    def order(self, info: StreamInfo) -> list[int]:
        """The shards this rank reads in the epoch ``info`` names, in order.

        Raises:
            ValueError: There are fewer shards than ranks.
        """
        count = len(self.shards)
        if count < info.world_size:
            raise ValueError(
                f"{count} shards for {info.world_size} ranks: every rank needs at least one"
            )
        order = list(range(count))
        if self.shuffle:
            order = np.random.default_rng([info.seed, info.epoch]).permutation(count).tolist()
        return order[info.rank :: info.world_size]

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch being read is (``{}`` between epochs): JSON-serialisable."""
        walk = self._walk or self._loaded
        # The walk's places are in the order of the shards, which `shuffle` decides.
        return {**walk.state(), "shuffle": self.shuffle} if walk is not None else {}

    def _check(self, state: object) -> Walk:
        """``state`` as a walk of these settings' (see :func:`check_walk`)."""
        saved = state.get("shuffle", self.shuffle) if isinstance(state, dict) else None
        if saved is not self.shuffle:
            raise ValueError(
                f"TarShards state saved with shuffle={saved!r}: its places are in another "
                f"order of the shards than shuffle={self.shuffle} gives"
            )
        return check_walk(state, self.interleave, self.shuffle_buffer, len(self.shards))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next epoch of the same number continue from ``state``.

        Raises:
            ValueError: The state is not one these settings could have saved, or, loaded
                by a loader, not one of the epoch, seed and rank of the loader's state around
                it (the message names the field); nothing changed.
        """
        walk = None
        if not isinstance(state, dict) or state:  # {}: between epochs
            walk = self._check(state)
        info = stream_info()  # inside a loader's load_state_dict: the epoch it resumes
        if walk is not None and info is not None:
            self._check_saved_in(walk, info)
        self._loaded = walk

    def load_elastic(self, states: list[dict[str, Any]], rank: int, world_size: int) -> None:
        """Make the next epoch of the same number the rest of the epoch that the ranks whose
        ``states`` these are had walked, re-split for rank ``rank`` of ``world_size``: every
        sample none of them had handed out, exactly once over the new ranks. A rank whose
        share of the epoch had run out is given as ``{}`` (its state between epochs).

        Raises:
            ValueError: A state is refused, or they are not one of each rank of one epoch.
        """
        walks = [self._check(state) for state in states if state != {}]
        if not walks:
            raise ValueError("TarShards elastic resume needs the state of a rank inside the epoch")
        first = walks[0]
        ranks = sorted(w.rank for w in walks)
        if (
            len(states) != first.world_size
            or len(set(ranks)) != len(ranks)
            or any(
                (w.epoch, w.seed, w.world_size) != (first.epoch, first.seed, first.world_size)
                for w in walks
            )
        ):
            raise ValueError(
                "TarShards elastic resume needs one state of each rank of one epoch and seed, "
                f"got {len(states)} states of ranks {ranks} of world sizes "
                f"{sorted({w.world_size for w in walks})}"
            )
        info = stream_info()
        if info is not None and (first.epoch, first.seed) != (info.epoch, info.seed):
            raise ValueError(
                f"TarShards states of epoch {first.epoch} and seed {first.seed} differ from "
                f"the loader's state, of epoch {info.epoch} and seed {info.seed}"
            )
        walks.sort(key=lambda w: w.rank)
        orders = []
        for walk in walks:
            info = StreamInfo(walk.rank, walk.world_size, walk.epoch, walk.seed, 0)
            order = self.order(info) if walk.plan is None else [u[0] for u in walk.plan]
            if len(order) != walk.shards:
                raise ValueError(f"TarShards state of rank {walk.rank} names another shard count")
            orders.append(order)
        self._loaded = regroup(walks, orders, rank, world_size, self.interleave)

    def _check_saved_in(self, walk: Walk, info: StreamInfo) -> list[int]:
        """Refuse ``walk`` unless it was saved in the epoch, seed and rank ``info`` names; the
        order of the shards it walks.

        An elastic epoch's walk counts the pieces its plan names, not the rank's shards, and
        its order is empty: the epoch's own split of the shards, which needs one for every
        rank, is not made.
        """
        order = self.order(info) if walk.plan is None else []
        count = len(order) if walk.plan is None else len(walk.plan)
        here = (info.epoch, info.seed, info.rank, info.world_size, count)
        saved = (walk.epoch, walk.seed, walk.rank, walk.world_size, walk.shards)
        if saved != here:
            raise ValueError(
                f"TarShards state (epoch, seed, rank, world_size, shards) {saved} "
                f"differs from this epoch's {here}"
            )
        return order

    def _begin(self, info: StreamInfo) -> tuple[Walk, list[int]]:
        """The epoch's walk (a loaded one, or a fresh one) and the order of its shards."""
        loaded, self._loaded = self._loaded, None
        if loaded is not None and loaded.epoch == info.epoch:
            return loaded, self._check_saved_in(loaded, info)
        order = self.order(info)
        here = (info.epoch, info.seed, info.rank, info.world_size, len(order))
        return Walk.start(*here, self.interleave), order

    async def __aiter__(self) -> AsyncIterator[Any]:
        info = stream_info() or StreamInfo(0, 1, 0, 0, 0)
        walk, order = self._begin(info)
        self._walk = walk
        threads = ThreadPool(self.interleave, "asyncloader-shard")

        def start(position: int, skip: int = 0) -> Shard:
            index, first, keep = walk.unit(order, position)
            producer = self._producer(index, threads.run)
            return Shard(_name(self.shards, index), self.buffer, first + skip, producer, keep)

        readers = [start(p, taken) for p, taken in walk.slots]
        # The next shards' requests start before their turn, so that a shard's end does not
        # stall the round-robin for a request's latency.
        ahead: deque[Shard] = deque()

        def top_up() -> None:
            while len(ahead) < self.interleave and walk.opened + len(ahead) < walk.shards:
                ahead.append(start(walk.opened + len(ahead)))

        top_up()
        try:
            pool = await self._refill(walk, start)
            size, base = self.shuffle_buffer, walk.base
            while walk.slots:
                turn = walk.turn
                item = await readers[turn].next()
                if item is _END:
                    if walk.opened < walk.shards:
                        readers[turn] = ahead.popleft()
                        walk.slots[turn] = [walk.opened, 0]
                        walk.opened += 1
                        top_up()
                    else:
                        del readers[turn], walk.slots[turn]
                        walk.turn = turn if turn < len(walk.slots) else 0
                    continue
                slot = walk.slots[turn]
                taken, slot[1] = slot[1], slot[1] + 1
                walk.turn = (turn + 1) % len(walk.slots)
                if size == 0:
                    yield item
                elif len(pool) < size:
                    pool.append(item)
                    walk.buffered.append((slot[0], taken))
                else:
                    drawn = draw(base, walk.draws, size)
                    walk.draws += 1
                    item, pool[drawn] = pool[drawn], item
                    walk.buffered[drawn] = (slot[0], taken)
                    yield item
            while pool:  # the shards are done: the buffer empties in a random order
                drawn = draw(base, walk.draws, len(pool))
                walk.draws += 1
                pool[drawn], pool[-1] = pool[-1], pool[drawn]
                walk.buffered[drawn], walk.buffered[-1] = walk.buffered[-1], walk.buffered[drawn]
                walk.buffered.pop()
                yield pool.pop()
        finally:
            for reader in [*readers, *ahead]:
                reader.cancel()
            threads.shutdown(wait=False)
            if self._walk is walk:
                self._walk = None

    async def _refill(self, walk: Walk, start: Any) -> list[Any]:
        """The shuffle buffer's samples of a resumed walk, read again from their shards,
        ``interleave`` of them at a time: a buffer can hold samples of hundreds of shards,
        and each shard read holds a request and ``buffer`` samples."""
        wanted: dict[int, set[int]] = {}
        for p, i in walk.buffered:
            wanted.setdefault(p, set()).add(i)
        turns = asyncio.Semaphore(self.interleave)

        async def read(p: int) -> dict[int, Any]:
            async with turns:
                return await read_one(p)

        async def read_one(p: int) -> dict[int, Any]:
            reader: Shard = start(p)
            found: dict[int, Any] = {}
            try:
                for i in range(max(wanted[p]) + 1):
                    item = await reader.next()
                    if item is _END:
                        raise ValueError(
                            f"TarShards state: shard {reader.name} has {i} samples, not the "
                            f"{max(wanted[p]) + 1} the state names (did it change?)"
                        )
                    if i in wanted[p]:
                        found[i] = item
            finally:
                reader.cancel()
            return found

        found = dict(zip(wanted, await asyncio.gather(*(read(p) for p in wanted)), strict=True))
        return [found[p][i] for p, i in walk.buffered]

    def __repr__(self) -> str:
        kind = type(self).__name__
        return f"{kind}({len(self.shards)} shards, interleave={self.interleave})"


class TarShards(ShardStream):
    """A stream of WebDataset samples from tar shards (``.tar``, or compressed ``.tar.gz``).

    A sample is the consecutive members of a shard that share a key: ``000123.jpg``,
    ``000123.cls`` → ``{"__key__": "000123", "__shard__": "<shard>", "jpg": b"...",
    "cls": b"..."}`` (extensions lower-cased, as WebDataset); decode it in the loader's
    ``transform``. Pass it to :class:`~asyncloader.DataLoader` as any stream.

    Args:
        shards: The dataset whose items are the shards: a :class:`FileDataset`,
            :class:`HttpDataset` or :class:`ObjectStoreDataset` (a list, a template or, with
            ``ObjectStoreDataset.from_prefix``, a prefix), with its locations, retries,
            limits and credentials.
        interleave: Shards read at once, their samples taken in turn. It fixes the order, so
            it is a setting of its own, not ``num_workers``.
        shuffle: Permute the shards every epoch from the loader's ``(seed, epoch)``.
        shuffle_buffer: Mix the samples in a buffer of this many: each sample that arrives
            takes the place of one drawn at random from ``(seed, epoch)``, which comes out
            (``0``: no buffer).
        buffer: Samples read ahead of the round-robin, per open shard.
        max_bytes: The largest sample accepted: its members' sizes together, each member
            after the first counted as at least one 512-byte tar block, so that many empty
            members are bounded too (checked from each member's header before it is read).
        length: The samples a rank reads in an epoch, if you know it (from the shards'
            writer): the stream's ``len()``, so that the loader has one. It does not cut or
            pad the epoch, which ends with the shards; a stream that gives more is logged
            once an epoch, as torch warns. Lightning's ``Trainer`` needs it to resume
            exactly: without a ``len()`` it reads a batch ahead to find the epoch's end, and
            the checkpoint counts that batch as trained on (docs/checkpointing.md).

    Ranks: with ``world_size`` ranks, rank ``r`` reads shards ``r``, ``r + world_size``, ...
    of the epoch's order. Fewer shards than ranks fails the epoch at its first batch (the
    rest of an epoch resumed over more ranks than its pieces goes on: see :meth:`load_elastic`).

    Resume: :meth:`state_dict` is the epoch's walk (:mod:`._walk`), which the loader saves
    after each batch received; a loader restored from it reads only the open shards and the
    buffer's samples again, not the epoch.
    """

    def __init__(
        self,
        shards: ShardSource,
        *,
        interleave: int = 4,
        shuffle: bool = False,
        shuffle_buffer: int = 0,
        buffer: int = 64,
        max_bytes: int | None = None,
        length: int | None = None,
    ) -> None:
        super().__init__(
            shards,
            interleave=interleave,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            buffer=buffer,
            length=length,
        )
        self.max_bytes = _check_max_bytes(max_bytes)

    def _producer(self, index: int, blocking: Blocking) -> Callable[[Shard], Awaitable[None]]:
        return tar_producer(self.shards, index, self.max_bytes, blocking)
