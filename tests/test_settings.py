"""Invalid settings fail at construction, naming the setting and the value."""

from __future__ import annotations

import functools
from typing import Any, cast

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from asyncloader import Compose, DataLoader, RandomSampler

from .datasets import SyncData

BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"batch_size": 2.5}, TypeError, "batch_size"),
    ({"batch_size": True}, TypeError, "batch_size"),
    ({"num_workers": -1}, ValueError, "num_workers"),
    ({"item_concurrency": 0}, ValueError, "item_concurrency"),
    ({"prefetch_depth": 0}, ValueError, "prefetch_depth"),
    ({"cpu_threads": 0}, ValueError, "cpu_threads"),
    ({"timeout": -1}, ValueError, "timeout"),  # 0 is torch's "no time-out"
    ({"timeout": float("nan")}, ValueError, "timeout"),
    ({"timeout": "1"}, TypeError, "timeout"),
    ({"drop_last": 1}, TypeError, "drop_last"),
    ({"shuffle": "yes"}, TypeError, "shuffle"),
    ({"pin_memory": None}, TypeError, "pin_memory"),
    ({"seed": -1}, ValueError, "seed"),
    ({"transform": 3}, TypeError, "transform"),
    ({"collate_fn": "list"}, TypeError, "collate_fn"),
    ({"sampler": 5}, TypeError, "sampler"),
    ({"sampler": [0], "shuffle": True}, ValueError, "sampler"),
]


@pytest.mark.parametrize(("settings", "error", "name"), BAD)
def test_each_invalid_setting_is_named(
    settings: dict[str, Any], error: type[Exception], name: str
) -> None:
    with pytest.raises(error, match=name) as caught:
        DataLoader(SyncData(4), **settings)
    value = next(iter(settings.values()))
    assert repr(value) in str(caught.value) or name == "sampler"


@given(
    st.sampled_from(["batch_size", "num_workers", "item_concurrency", "prefetch_depth"]),
    st.one_of(st.integers(max_value=-1), st.floats(), st.text(max_size=3), st.none()),
)
def test_any_invalid_count_fails_at_construction(name: str, value: object) -> None:
    assume(not (name == "batch_size" and value is None))  # torch's "no batching": valid
    settings: dict[str, Any] = {name: value}
    with pytest.raises((ValueError, TypeError), match=name):
        DataLoader(SyncData(4), **settings)


async def _doubled(index: int, item: int) -> int:
    return 2 * item


async def _listed(items: list[int]) -> list[int]:
    return items


class _AsyncCall:
    async def __call__(self, index: int, item: int) -> int:
        return item


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"transform": _doubled}, "transform"),
        ({"transform": _AsyncCall()}, "transform"),
        ({"transform": Compose([lambda i, x: x, _doubled])}, r"transform \(its step 1\)"),
        ({"collate_fn": _listed}, "collate_fn"),
    ],
)
def test_an_async_transform_or_collate_fn_fails_at_construction(
    settings: dict[str, Any], named: str
) -> None:
    # They run on the CPU threads, which do not await: an async transform failed each batch
    # as "cannot collate items of type coroutine", and an async collate_fn gave coroutines
    # as batches, never awaited.
    with pytest.raises(TypeError, match=f"{named} is an async function"):
        DataLoader(SyncData(8), batch_size=4, **settings)


def _of_the_item(item: int) -> int:
    return item


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"transform": _of_the_item}, r"transform must take \(index, item\)"),
        ({"transform": lambda x: x}, "torch-style"),
        ({"transform": abs}, r"transform must take \(index, item\)"),
        ({"transform": lambda i, x, extra: x}, r"transform must take \(index, item\)"),
        ({"transform": Compose([lambda i, x: x, cast(Any, _of_the_item)])}, r"\(its step 1\)"),
        ({"collate_fn": lambda: []}, r"collate_fn must take \(items\)"),
        ({"collate_fn": lambda a, b: a}, r"collate_fn must take \(items\)"),
    ],
)
def test_a_transform_or_collate_fn_that_cannot_take_its_arguments_fails_at_construction(
    settings: dict[str, Any], said: str
) -> None:
    # Each was taken, and every batch failed ("takes 1 positional argument but 2 were
    # given"): the common case is a torch transform, which takes the item alone.
    with pytest.raises(TypeError, match=said):
        DataLoader(SyncData(8), batch_size=4, **settings)


def test_callables_whose_arguments_cannot_be_read_are_taken() -> None:
    # A C function without a signature (nothing to check), and ones that take more.
    for transform in (lambda *args: args[-1], lambda i, x, extra=1: x, functools.partial(max)):
        DataLoader(SyncData(8), batch_size=4, transform=transform)
    DataLoader(SyncData(8), batch_size=4, collate_fn=lambda items, *more: items)


def test_valid_settings_are_kept() -> None:
    loader = DataLoader(
        SyncData(4),
        batch_size=3,
        num_workers=2,
        item_concurrency=5,
        prefetch_depth=4,
        seed=9,
        shuffle=True,
    )
    assert (loader.batch_size, loader.num_workers, loader.item_concurrency) == (3, 2, 5)
    assert loader.prefetch_depth == 4
    assert loader.seed == 9
    assert isinstance(loader.sampler, RandomSampler)
    assert "batch_size=3" in repr(loader)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("num_workers", 8),
        ("item_concurrency", 64),
        ("prefetch_depth", 9),
        ("drop_last", True),
        ("sampler", None),
        ("batch_sampler", None),
        ("seed", 1),
        ("rank", 1),
        ("world_size", 4),
        ("batch_size", 7),
        ("dataset", []),
        ("epoch", 3),
    ],
)
def test_a_setting_assigned_after_construction_is_refused(name: str, value: object) -> None:
    # They were taken as new attributes that the loader never read: num_workers said 8 and
    # the epochs ran with 2.
    loader = DataLoader(SyncData(8), batch_size=4, num_workers=2, seed=5)
    before = getattr(loader, name)
    with pytest.raises(AttributeError, match=name):
        setattr(loader, name, value)
    assert getattr(loader, name) == before
    assert [len(batch) for batch in loader] == [4, 4]


def test_shuffle_without_a_seed_draws_one_and_keeps_it() -> None:
    loader = DataLoader(SyncData(40), batch_size=40, shuffle=True)
    seed = loader.seed
    first = next(iter(loader)).tolist()
    again = DataLoader(SyncData(40), batch_size=40, shuffle=True, seed=seed)
    assert next(iter(again)).tolist() == first


def test_set_epoch_chooses_the_order() -> None:
    loader = DataLoader(SyncData(30), batch_size=30, shuffle=True, seed=1)
    epochs = [next(iter(loader)).tolist() for _ in range(3)]
    assert loader.epoch == 3
    loader.set_epoch(1)
    assert next(iter(loader)).tolist() == epochs[1]
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)


@given(
    st.sampled_from(
        [
            "batch_size",
            "num_workers",
            "item_concurrency",
            "prefetch_depth",
            "cpu_threads",
            "timeout",
            "drop_last",
            "shuffle",
            "pin_memory",
            "seed",
            "transform",
            "collate_fn",
            "sampler",
            "errors",
            "max_errors",
            "rank",
            "world_size",
        ]
    ),
    st.one_of(
        st.integers(max_value=-1),
        st.floats(allow_nan=True),
        st.text(max_size=3),
        st.binary(max_size=2),
        st.lists(st.none(), max_size=1),
        st.just(object()),
    ),
)
def test_every_setting_refuses_bad_values_at_construction(name: str, value: object) -> None:
    settings: dict[str, Any] = {name: value}
    message = None
    try:
        DataLoader(SyncData(4), **settings)
    except (ValueError, TypeError) as error:
        message = str(error)
    if message is not None:
        assert name in message
    else:
        # Only valid values get through: a positive float timeout, a list of ints as sampler.
        assert name in ("timeout", "sampler")
        assert value is not None
