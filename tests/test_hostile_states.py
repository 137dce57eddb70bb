"""Saved states no loader wrote, resume at the edges, ``batch_size=None`` and what
``default_collate`` is handed (torch's own samplers and datasets: ``test_hostile_torch.py``)."""

from __future__ import annotations

import collections.abc
import importlib.util
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncloader import DataLoader, default_collate
from asyncloader.testing import assert_equal_output_after_checkpoint

from .datasets import SyncData


def batches(loader: DataLoader) -> list[list[int]]:
    return [np.asarray(batch).tolist() for batch in loader]


def taken(loader: DataLoader, count: int) -> dict[str, Any]:
    """The state after the consumer took ``count`` batches of a fresh epoch."""
    iterator: Any = iter(loader)
    for _ in range(count):
        next(iterator)
    state = loader.state_dict()
    iterator.close()
    return state


class Rotating:
    """A sampler with a state of its own."""

    def __init__(self, n: int) -> None:
        self.n, self.shift = n, 0

    def __iter__(self) -> Iterator[int]:
        self.shift += 1
        return iter([(i + self.shift) % self.n for i in range(self.n)])

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"shift": self.shift}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if not isinstance(state.get("shift"), int):
            raise KeyError("shift")
        self.shift = state["shift"]


CONFIGS: dict[str, Callable[[], DataLoader]] = {
    "shuffled": lambda: DataLoader(SyncData(23), batch_size=4, shuffle=True, seed=3),
    "os seed": lambda: DataLoader(SyncData(23), batch_size=4, shuffle=True),
    "rank 1 of 2": lambda: DataLoader(
        SyncData(23), batch_size=4, shuffle=True, seed=3, rank=1, world_size=2
    ),
    "custom sampler": lambda: DataLoader(SyncData(23), batch_size=4, sampler=Rotating(23)),
    "unbatched": lambda: DataLoader(SyncData(9), batch_size=None, shuffle=True, seed=4),
}
if importlib.util.find_spec("torch") is not None:  # not on the Pythons without its wheel here
    from .torch_configs import TORCH_CONFIGS

    CONFIGS.update(TORCH_CONFIGS)


def nested(depth: int) -> list[Any]:
    """A list of a list of ... ``depth`` deep: past the interpreter's recursion limit."""
    outer: list[Any] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


DEEP = nested(100_000)
HOSTILE: list[object] = [
    -1,
    0,
    1,
    2,
    10**30,
    None,
    "3",
    2.5,
    True,
    [],
    {},
    {"kind": "random"},
    "random",
    10**5000,  # past what int() and json.dumps turn into digits
    DEEP,
]


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    config=st.sampled_from(sorted(CONFIGS)),
    point=st.integers(0, 7),
    field=st.sampled_from(
        [
            "format",
            "epoch",
            "batches_received",
            "seed",
            "dataset_length",
            "batch_size",
            "drop_last",
            "world_size",
            "rank",
            "sampler",
            "offset",
            "extra",
        ]
    ),
    value=st.sampled_from([*HOSTILE, "<delete>"]),
)
def test_a_mutated_state_is_refused_naming_its_field_or_resumes_cleanly(
    config: str, point: int, field: str, value: object
) -> None:
    make = CONFIGS[config]
    with make() as first:
        state = taken(first, min(point, len(first)))
    mutated = json.loads(json.dumps(state))
    if value == "<delete>":
        mutated.pop(field, None)
    else:
        mutated[field] = value
    with make() as second:
        before = second.state_dict()
        refused = None
        try:
            second.load_state_dict(mutated)
        except ValueError as error:
            refused = str(error)
        if refused is not None:
            shown = "state" if field not in state and value == "<delete>" else field
            assert shown in refused, (field, value, refused)
            assert second.state_dict() == before, "a refused state changed the loader"
            with make() as fresh:
                fresh.load_state_dict(before)  # the loader as it was, seed and sampler
                assert batches(second) == batches(fresh)
            return
        # Accepted: it is a state some loader of this kind could have saved. It runs whole.
        assert len(batches(second)) <= len(second)


def test_a_position_past_the_end_and_zero_ranks_are_refused() -> None:
    with DataLoader(SyncData(12), batch_size=3, shuffle=True, seed=1) as loader:
        state = loader.state_dict()
        changes: list[tuple[dict[str, Any], str]] = [
            ({"batches_received": 5}, "batches_received"),
            ({"world_size": 0}, "world_size"),
            ({"rank": 2, "world_size": 2}, "rank"),
            ({"seed": -5}, "seed"),
            ({"sampler": "random"}, "sampler"),
            ({"offset": 13}, "offset"),
        ]
        for change, field in changes:
            with pytest.raises(ValueError, match=field):
                loader.load_state_dict({**state, **change})
        assert loader.seed == 1
        assert loader.state_dict() == state
        loader.load_state_dict({**state, "batches_received": 4})  # the whole epoch received
        assert batches(loader) == []


def test_a_refused_state_leaves_an_os_drawn_seed_alone() -> None:
    loader = DataLoader(SyncData(12), batch_size=3, shuffle=True)
    seed, expected = (
        loader.seed,
        batches(DataLoader(SyncData(12), batch_size=3, shuffle=True, seed=loader.seed)),
    )
    state = loader.state_dict()
    with pytest.raises(ValueError, match="world_size"):
        loader.load_state_dict({**state, "seed": 7, "world_size": 0})
    assert loader.seed == seed
    assert batches(loader) == expected


def test_the_state_right_after_loading_is_the_position_loaded() -> None:
    make = CONFIGS["shuffled"]
    with make() as first:
        state = taken(first, 3)
        rest = batches(first)  # a new epoch 0 from the start... so compute from a reload
    with make() as reference:
        reference.load_state_dict(state)
        rest = batches(reference)
    with make() as second:
        second.load_state_dict(state)
        again = second.state_dict()
    assert again["epoch"] == 0
    assert again["batches_received"] == 3
    with make() as third:
        third.load_state_dict(json.loads(json.dumps(again)))
        assert batches(third) == rest


def test_a_state_saved_inside_an_elastic_epoch_resumes_into_the_same_shares() -> None:
    def loader(rank: int, world: int) -> DataLoader:
        return DataLoader(
            SyncData(40), batch_size=2, shuffle=True, seed=6, rank=rank, world_size=world
        )

    with loader(0, 2) as saved_by_two:
        state = taken(saved_by_two, 3)
    for rank in range(3):
        with loader(rank, 3) as uninterrupted:
            uninterrupted.load_state_dict(state)
            expected = batches(uninterrupted)
        with loader(rank, 3) as first:
            first.load_state_dict(state)
            iterator: Any = iter(first)
            head = [np.asarray(next(iterator)).tolist() for _ in range(2)]
            inner = first.state_dict()
            iterator.close()
        assert inner["offset"] == 12  # 2 ranks x 3 batches x 2 samples
        with loader(rank, 3) as second:
            second.load_state_dict(json.loads(json.dumps(inner)))
            assert head + batches(second) == expected


def test_batch_size_none_yields_items_one_by_one() -> None:
    loader = DataLoader(SyncData(5), batch_size=None)
    assert len(loader) == 5
    assert loader.batch_size is None
    assert [int(item) for item in loader] == [0, 1, 2, 3, 4]
    assert list(DataLoader(SyncData(3), batch_size=None, collate_fn=lambda x: x * 10)) == [
        0,
        10,
        20,
    ]
    with pytest.raises(ValueError, match="drop_last"):
        DataLoader(SyncData(3), batch_size=None, drop_last=True)
    assert_equal_output_after_checkpoint(CONFIGS["unbatched"], epochs=2)


class Pair(collections.abc.Sequence[int]):
    def __init__(self, values: list[int]) -> None:
        self.values = values

    def __getitem__(self, index: Any) -> Any:
        return self.values[index]

    def __len__(self) -> int:
        return len(self.values)


def test_default_collate_takes_what_torch_takes() -> None:
    assert default_collate(np.array([0.0, 1.0])).tolist() == [0.0, 1.0]
    assert default_collate(np.array([0.0])).tolist() == [0.0]
    assert default_collate(np.array(["a", "b"])) == ["a", "b"]
    ranges = default_collate([range(3), range(3)])
    assert [field.tolist() for field in ranges] == [[0, 0], [1, 1], [2, 2]]
    pairs = default_collate([Pair([1, 2]), Pair([3, 4])])
    assert isinstance(pairs, Pair)
    assert [np.asarray(field).tolist() for field in pairs] == [[1, 3], [2, 4]]
    assert np.asarray(default_collate(range(3))).tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="mixes sequences"):
        default_collate([range(2), 5])


def test_every_state_of_a_list_is_checked_and_they_must_agree() -> None:
    # A map-style loader needs any one rank's state (the ranks move in lockstep), but a list
    # is every rank's: a broken or disagreeing one was passed over, since only the first was
    # read. It is refused, naming what is wrong, and the loader is left as it was.
    states = []
    for rank in range(2):
        with DataLoader(
            SyncData(23), batch_size=4, shuffle=True, seed=3, rank=rank, world_size=2
        ) as saver:
            states.append(taken(saver, 1 + rank))  # rank 1 one batch further: not one job's
    first, later = states
    second = {**later, "batches_received": first["batches_received"]}
    cases: list[tuple[list[Any], str]] = [
        ([first, None], "dict"),
        ([first, "x"], "dict"),
        ([first, {**second, "kind": "stream"}], "kind"),
        ([first, {**second, "dataset_length": 5}], "dataset_length"),
        ([first, later], "batches_received"),
        ([first, {**second, "epoch": 1}], "epoch"),
        ([first, first], "rank"),
    ]
    for listed, match in cases:
        loader = DataLoader(SyncData(23), batch_size=4, shuffle=True, seed=3)
        before = loader.state_dict()
        with pytest.raises(ValueError, match=match):
            loader.load_state_dict(listed)
        assert loader.state_dict() == before
    with DataLoader(SyncData(23), batch_size=4, shuffle=True, seed=3) as loader:
        loader.load_state_dict([second, first])  # one job's states, in any order
        assert loader.state_dict()["batches_received"] == 1
