"""``TarShards``: WebDataset samples streamed from tar shards on files, HTTP or object stores.

Each epoch orders the shards (permuted by ``(seed, epoch)`` with ``shuffle=True``), gives every
rank its share, and reads ``interleave`` of them at once: each shard with one streaming read
(:meth:`open_stream` of the dataset that locates the shards) parsed by :mod:`tarfile` on a
thread of its own, at most ``buffer`` samples ahead. Samples are taken from the open shards in
turn, a fixed round-robin, and a shard that ends gives its turn to the next shard in the order,
so the samples' order depends only on the shards, the seed, the epoch and ``interleave``: never
on ``num_workers`` or timing. A shard that fails (cannot be opened, is not a tar, ends early,
has a bad member) yields one :class:`~asyncloader.SampleError` naming it and the member, in its
place in the order, and the epoch goes on with the next shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any, Final, Protocol

import numpy as np

from .._settings import check_bool, check_int
from .._stream import SampleError, StreamInfo, stream_info
from ._http import _check_max_bytes
from ._redact import redact_url
from ._tar import Readable, ShardError, samples
from ._walk import Walk, check_walk

_END: Final = object()


class ShardSource(Protocol):
    """Where the shards are: a :class:`FileDataset`, :class:`HttpDataset` or
    :class:`ObjectStoreDataset` whose items are the shards."""

    def __len__(self) -> int: ...

    def open_stream(self, index: int, loop: asyncio.AbstractEventLoop) -> Readable: ...


def _name(source: Any, index: int) -> str:
    try:
        return redact_url(str(source.locations[index]))
    except Exception:  # a location that cannot be rendered fails when it is opened
        return f"#{index}"


class _Reader:
    """One shard read on its own thread, its samples handed to the loop ``buffer`` at most
    ahead of the round-robin."""

    def __init__(
        self,
        source: ShardSource,
        index: int,
        loop: asyncio.AbstractEventLoop,
        buffer: int,
        max_bytes: int | None,
        skip: int = 0,
    ) -> None:
        self._source, self._index, self._loop = source, index, loop
        self._max_bytes = max_bytes
        self._skip = skip
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._room = threading.Semaphore(buffer)
        self._cancelled = False
        self._file: Readable | None = None
        self._lock = threading.Lock()
        self.name = _name(source, index)
        threading.Thread(target=self._run, name=f"asyncloader-shard-{index}", daemon=True).start()

    async def next(self) -> Any:
        """The shard's next sample (or :class:`SampleError`), or ``_END``."""
        item = await self._queue.get()
        self._room.release()
        return item

    def cancel(self) -> None:
        """Stop reading (from the loop): the thread ends at its next step."""
        with self._lock:
            self._cancelled = True
            file = self._file
        self._room.release()  # a thread waiting for room wakes and sees the cancel
        if file is not None:
            with contextlib.suppress(Exception):
                file.close()  # a pipe's close cancels its request; a read in flight ends

    def _deliver(self, item: Any) -> bool:
        self._room.acquire()
        if self._cancelled:
            return False
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody reads any more
            return False
        return True

    def _run(self) -> None:
        try:
            try:
                file = self._source.open_stream(self._index, self._loop)
            except Exception as error:
                raise ShardError(f"shard {self.name}: cannot be opened: {error}") from None
            with self._lock:
                if self._cancelled:
                    file.close()
                    return
                self._file = file
            try:
                for position, sample in enumerate(samples(file, self.name, self._max_bytes)):
                    if position >= self._skip and not self._deliver(sample):
                        return
            finally:
                file.close()
        except Exception as error:
            if not self._cancelled and not self._deliver(SampleError(error)):
                return
        if not self._cancelled:
            self._deliver(_END)


class TarShards:
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
        max_bytes: The largest member accepted (checked from its header before it is read).

    Ranks: with ``world_size`` ranks, rank ``r`` reads shards ``r``, ``r + world_size``, ...
    of the epoch's order. Fewer shards than ranks fails the epoch at its first batch.

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
    ) -> None:
        if not callable(getattr(shards, "open_stream", None)) or not hasattr(shards, "__len__"):
            raise TypeError(
                "shards must be a FileDataset, HttpDataset or ObjectStoreDataset (a dataset "
                f"with open_stream and __len__), got {type(shards).__name__}"
            )
        self.shards = shards
        self.interleave = check_int("interleave", interleave, 1)
        self.shuffle = check_bool("shuffle", shuffle)
        self.shuffle_buffer = check_int("shuffle_buffer", shuffle_buffer, 0)
        self.buffer = check_int("buffer", buffer, 1)
        self.max_bytes = _check_max_bytes(max_bytes)
        self._walk: Walk | None = None
        self._loaded: Walk | None = None

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
        return walk.state() if walk is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next epoch of the same number continue from ``state``.

        Raises:
            ValueError: The state is not one these settings could have saved (the message
                names the field); nothing changed.
        """
        self._loaded = check_walk(state, self.interleave, self.shuffle_buffer) if state else None

    def _begin(self, info: StreamInfo, order: list[int]) -> Walk:
        loaded, self._loaded = self._loaded, None
        here = (info.epoch, info.seed, info.rank, info.world_size, len(order))
        if loaded is not None:
            saved = (loaded.epoch, loaded.seed, loaded.rank, loaded.world_size, loaded.shards)
            if saved[0] == info.epoch:
                if saved != here:
                    raise ValueError(
                        f"TarShards state (epoch, seed, rank, world_size, shards) {saved} "
                        f"differs from this epoch's {here}"
                    )
                return loaded
        return Walk.start(*here, self.interleave)

    async def __aiter__(self) -> AsyncIterator[Any]:
        info = stream_info() or StreamInfo(0, 1, 0, 0, 0)
        order = self.order(info)
        walk = self._walk = self._begin(info, order)
        loop = asyncio.get_running_loop()

        def start(position: int, skip: int = 0) -> _Reader:
            shard = order[position]
            return _Reader(self.shards, shard, loop, self.buffer, self.max_bytes, skip)

        readers = [start(p, taken) for p, taken in walk.slots]
        try:
            pool = await self._refill(walk, start)
            size, rng = self.shuffle_buffer, walk.rng
            assert rng is not None
            while walk.slots:
                turn = walk.turn
                item = await readers[turn].next()
                if item is _END:
                    if walk.opened < walk.shards:
                        readers[turn] = start(walk.opened)
                        walk.slots[turn] = [walk.opened, 0]
                        walk.opened += 1
                    else:
                        del readers[turn], walk.slots[turn]
                        walk.turn = turn if turn < len(walk.slots) else 0
                    continue
                place = [walk.slots[turn][0], walk.slots[turn][1]]
                walk.slots[turn][1] += 1
                walk.turn = (turn + 1) % len(walk.slots)
                if size == 0:
                    yield item
                elif len(pool) < size:
                    pool.append(item)
                    walk.buffered.append(place)
                else:
                    drawn = rng.randrange(size)
                    item, pool[drawn] = pool[drawn], item
                    walk.buffered[drawn] = place
                    yield item
            while pool:  # the shards are done: the buffer empties in a random order
                drawn = rng.randrange(len(pool))
                pool[drawn], pool[-1] = pool[-1], pool[drawn]
                walk.buffered[drawn], walk.buffered[-1] = walk.buffered[-1], walk.buffered[drawn]
                walk.buffered.pop()
                yield pool.pop()
        finally:
            for reader in readers:
                reader.cancel()
            if self._walk is walk:
                self._walk = None

    async def _refill(self, walk: Walk, start: Any) -> list[Any]:
        """The shuffle buffer's samples of a resumed walk, read again from their shards."""
        wanted: dict[int, set[int]] = {}
        for p, i in walk.buffered:
            wanted.setdefault(p, set()).add(i)

        async def read(p: int) -> dict[int, Any]:
            reader: _Reader = start(p)
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
        return f"TarShards({len(self.shards)} shards, interleave={self.interleave})"
