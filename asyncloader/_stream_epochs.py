"""Checkpoints of a stream's position, and the start of a stream's epoch from one.

A stream's state says which epoch the next batch comes from, how many of its batches the
consumer received, and, for a stream with its own ``state_dict()``/``load_state_dict()``, the
stream's state as it was right after the last batch received was read (taken on the reader's
thread, so a batch prefetched later does not move it). Resuming loads that state into the
stream before its next ``iter()``. A stream without one is read again from its start and the
items of the batches received are dropped (skip-ahead: they are read, not fetched for the
consumer; a warning says so).

The state is checked whole before anything changes, like a map-style loader's
(:mod:`._state`); a state of the other kind is refused.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ._map_epochs import EpochStart
from ._pool import ThreadPool
from ._sampler import batch_count
from ._settings import Settings
from ._state import FORMAT, Progress, Resume, check_layout, check_one_moment
from ._stream import (
    StreamBatches,
    StreamInfo,
    StreamKind,
    StreamReader,
    is_stateful,
    stream_length,
    telling,
)

if TYPE_CHECKING:
    from ._order import Order

KIND: Final = "stream"
_FIELDS: Final = (
    "format",
    "kind",
    "epoch",
    "batches_received",
    "seed",
    "batch_size",
    "drop_last",
    "world_size",
    "rank",
    "source",
)


@dataclass(frozen=True)
class StreamExpected:
    """What a stream state must agree with."""

    seed: int
    adopts_seed: bool
    batch_size: int | None
    drop_last: bool
    world_size: int
    stateful: bool
    """Whether the stream has ``state_dict()`` and ``load_state_dict()``."""


def write_stream_state(
    expected: StreamExpected, rank: int, epoch: int, received: int, source: str | None
) -> dict[str, Any]:
    """A state in the layout :func:`check_stream_state` reads (``source``: the stream's own
    state as JSON, or ``None``)."""
    return {
        "format": FORMAT,
        "kind": KIND,
        "epoch": epoch,
        "batches_received": received,
        "seed": expected.seed,
        "batch_size": expected.batch_size,
        "drop_last": expected.drop_last,
        "world_size": expected.world_size,
        "rank": rank,
        "source": None if source is None else json.loads(source),
    }


def check_stream_state(state: object, expected: StreamExpected, elastic: bool = False) -> Resume:
    """Check a whole stream state against this loader, changing nothing.

    Raises:
        ValueError: A field is missing, unknown, of the wrong type or range, or disagrees with
            this loader (a map-style loader's state among them); the message names it.
    """
    if not isinstance(state, dict):
        raise ValueError(f"a loader state is a dict, got {type(state).__name__}")
    if state.get("kind") != KIND:
        raise ValueError(
            f"state kind {state.get('kind')!r} is not {KIND!r}: this loader reads a stream, "
            "and the state is not a stream loader's"
        )
    epoch, batches, seed, world_size = check_layout(state, _FIELDS)
    for key in (
        ("batch_size", "drop_last") if elastic else ("batch_size", "drop_last", "world_size")
    ):
        ours = getattr(expected, key)
        if state[key] != ours or type(state[key]) is not type(ours):
            raise ValueError(
                f"state {key} {state[key]!r} differs from this loader's {ours!r}"
                + (": a stream cannot be re-split over ranks" if key == "world_size" else "")
            )
    if not expected.adopts_seed and seed != expected.seed:
        raise ValueError(f"state seed {seed} differs from this loader's seed {expected.seed}")
    source = state["source"]
    if source is not None and not expected.stateful:
        raise ValueError("state source holds a stream's own state, but this stream has none")
    # No bound from len(): a stream may give more than it says (only logged), and the states
    # saved past that point are its own. A resume without the stream's own state reads and
    # drops batches_received batches, and stops at the stream's end.
    try:
        copy = json.loads(json.dumps(state))
    except (TypeError, ValueError) as error:
        raise ValueError(f"a loader state must be JSON-serialisable: {error}") from None
    return Resume(epoch, batches, world_size, 0, copy)


class StreamEpochs:
    """A stream loader's epochs: where each starts, and the states of its position.

    Args:
        dataset: The stream.
        kind: ``"sync"`` or ``"async"``.
        order: The loader's seed and ranks.
        settings: The loader's settings.
        batch_size: The loader's ``batch_size`` as it reports it (``None`` unbatched).
    """

    def __init__(
        self,
        dataset: Any,
        kind: StreamKind,
        order: Order,
        settings: Settings,
        batch_size: int | None,
    ) -> None:
        self.dataset = dataset
        self.kind = kind
        self._order = order
        self._settings = settings
        self._batch_size = batch_size
        self._handed = False
        """Whether the stream was handed a state last (which it may hold still: an epoch
        begun and dropped before the stream was read has not taken it)."""

    def _expected(self) -> StreamExpected:
        dataset = self.dataset
        return StreamExpected(
            seed=self._order.seed,
            adopts_seed=not self._order.seed_given,
            batch_size=self._batch_size,
            drop_last=self._settings.drop_last,
            world_size=self._order.world_size,
            stateful=is_stateful(dataset),
        )

    def length(self) -> int:
        """The batches of an epoch (``len(loader)``).

        Raises:
            TypeError: The stream has no ``__len__``.
        """
        length = stream_length(self.dataset)
        if length is None:
            name = type(self.dataset).__name__
            if hasattr(self.dataset, "__len__"):  # one that refuses says why
                try:
                    len(self.dataset)
                except (TypeError, NotImplementedError) as error:
                    raise TypeError(f"{name} is a stream with no len(): {error}") from None
            raise TypeError(f"{name} is a stream with no __len__")
        settings = self._settings
        return batch_count(length, settings.batch_size, settings.drop_last)

    def state(self, progress: Progress | None, next_epoch: int) -> dict[str, Any]:
        """The position after what the consumer received (:meth:`DataLoader.state_dict`)."""
        expected, rank = self._expected(), self._order.rank
        if progress is None or progress.done or progress.stream.end == progress.received:
            return write_stream_state(expected, rank, next_epoch, 0, None)
        source = progress.stream.state_after(progress.received)
        return write_stream_state(expected, rank, progress.epoch, progress.received, source)

    def load(self, state: object) -> Resume:
        """Check a state and load the stream's own part of it into the stream.

        Raises:
            ValueError: The state is refused (:func:`check_stream_state`), or the stream's
                ``load_state_dict`` refused its part; nothing changed.
        """
        if isinstance(state, list):
            return self._load_elastic(state)
        resume = check_stream_state(state, self._expected())
        source, name = resume.state["source"], type(self.dataset).__name__
        saved_by, rank = resume.state["rank"], self._order.rank
        if source is not None and saved_by != rank:
            # Another rank's (Lightning saves rank 0's state alone, and every rank loads it):
            # its stream's state is of that rank's share. Ranks receive their batches in
            # lockstep, so this rank is as many batches into its own share.
            resume.state["source"] = source = None
            if resume.batches:
                warnings.warn(
                    f"the state is rank {saved_by}'s, and its {name} state is of that rank's "
                    f"share: the resumed epoch reads this rank's ({rank}) first "
                    f"{resume.batches} batches again and drops them",
                    stacklevel=3,
                )
        elif source is None and resume.batches:
            warnings.warn(
                f"{name} has no state_dict()/load_state_dict(): the resumed epoch reads its "
                f"first {resume.batches} batches again and drops them (exact only if it gives "
                "the same items in the same order each time the epoch is read)",
                stacklevel=3,
            )
        self._hand(source, resume.epoch, resume.state["seed"])
        if not self._order.seed_given:
            self._order.adopt_seed(resume.state["seed"])
        return resume

    def _hand(self, source: Any, epoch: int, seed: int) -> None:
        """Hand the stream its part of a loaded state. With none (a state between epochs, or
        another rank's), one handed before is dropped: the stream is handed ``{}``, its state
        between epochs, or the next epoch would begin from the earlier state.

        Raises:
            ValueError: The stream's ``load_state_dict`` refused it.
        """
        if source is None and not self._handed:
            return
        try:
            with telling(self._info(epoch, seed)):
                self.dataset.load_state_dict({} if source is None else source)
        except Exception as error:
            name = type(self.dataset).__name__
            if source is not None:
                raise ValueError(
                    f"state source: {name}.load_state_dict refused it: {error}"
                ) from error
            raise ValueError(
                f"state source: the state holds none of {name}'s, and {name}.load_state_dict "
                f"refused {{}} (its state between epochs, handed so that it drops the state "
                f"loaded before): {error!r}; accept {{}} as an epoch's start, or load the "
                "state into a new loader"
            ) from error
        self._handed = source is not None

    def _load_elastic(self, states: list[Any]) -> Resume:
        """States of every rank of another number of ranks: the rest of their epoch, re-split
        over this loader's ranks by the stream itself (``load_elastic``)."""
        name = type(self.dataset).__name__
        if not states:
            raise ValueError("an elastic resume needs the state of every rank, got none")
        every = sorted(
            (check_stream_state(state, self._expected(), elastic=True).state for state in states),
            key=lambda state: state["rank"],
        )
        check_one_moment(every, ("seed", "world_size"))
        first = min(every, key=lambda state: state["epoch"])
        # A rank whose share of the epoch ran out first (uneven shares; or, after the epoch's
        # last batch, one that had looked past it) names the next epoch's start: it has
        # nothing left of this one.
        over = {
            state["rank"]
            for state in every
            if state["epoch"] == first["epoch"] + 1 and not state["batches_received"]
        }
        inside = [state for state in every if state["rank"] not in over]
        check_one_moment(inside, ("epoch", "batches_received"))
        if [state["rank"] for state in every] != list(range(first["world_size"])):
            raise ValueError(
                f"an elastic resume needs one state of each of {first['world_size']} ranks"
            )
        if first["batches_received"] == 0:
            # No rank received a batch of this epoch (saved before its first, or after the
            # last epoch's end): there is nothing to re-split, and these ranks start it afresh.
            self._hand(None, first["epoch"], first["seed"])
            return self._adopt(first, None)
        load_elastic = getattr(self.dataset, "load_elastic", None)
        if load_elastic is None:
            raise ValueError(f"{name} cannot re-split an epoch over other ranks (no load_elastic)")
        # A rank whose epoch is over is given as a stream between epochs ({}).
        sources = [{} if state["rank"] in over else state["source"] for state in every]
        if any(source is None for source in sources):
            raise ValueError("state source: a rank's state holds no state of the stream")
        try:
            with telling(self._info(first["epoch"], first["seed"])):
                load_elastic(sources, self._order.rank, self._order.world_size)
        except Exception as error:
            raise ValueError(f"state source: {name}.load_elastic refused it: {error}") from error
        self._handed = True
        return self._adopt(first, json.dumps(self.dataset.state_dict()))

    def _adopt(self, first: dict[str, Any], own: str | None) -> Resume:
        """The resume of an elastic state whose first rank's is ``first``: its epoch from
        the start, with this rank's own stream state ``own`` (``None``: the stream's start)."""
        if not self._order.seed_given:
            self._order.adopt_seed(first["seed"])
        state = write_stream_state(self._expected(), self._order.rank, first["epoch"], 0, own)
        return Resume(first["epoch"], 0, self._order.world_size, 0, state)

    def _info(self, epoch: int, seed: int) -> StreamInfo:
        """What :func:`stream_info` says while epoch ``epoch`` is read with seed ``seed``."""
        order = self._order
        return StreamInfo(order.rank, order.world_size, epoch, seed, self._settings.num_workers)

    def start(self, epoch: int, resume: Resume | None, io: ThreadPool) -> EpochStart:
        """The batches of epoch ``epoch``, after those a loaded state had received."""
        order, settings = self._order, self._settings
        epoch = order.run_epoch(epoch)
        if resume is not None and resume.epoch != epoch:
            resume = None
        first = resume.batches if resume is not None else 0
        own_state = resume is not None and resume.state["source"] is not None
        info = self._info(epoch, order.seed)
        length = stream_length(self.dataset)
        reader = StreamReader(
            self.dataset,
            self.kind,
            io,
            info,
            first=first,
            skip=0 if own_state else first * settings.batch_size,
            drop_last=settings.drop_last,
            window=settings.window,
            length=length,
        )
        batches = StreamBatches(reader, settings.batch_size, first, length, settings.drop_last)
        return batches, Progress(epoch, first, stream=reader), length or 0
