"""default_collate: NumPy first, recursive, torch when the items are tensors."""

from __future__ import annotations

import collections
import types
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, NamedTuple

import numpy as np
import pytest

from asyncloader import Compose, DataLoader, default_collate

from .datasets import SyncData


class Pair(NamedTuple):
    x: int
    name: str


def test_numbers_and_arrays_are_stacked() -> None:
    assert default_collate([1, 2, 3]).tolist() == [1, 2, 3]
    assert default_collate([1.5, 2.0]).dtype == np.float64
    stacked = default_collate([np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)])
    assert stacked.shape == (2, 2, 3)
    assert stacked.dtype == np.float32


def test_a_batch_is_in_c_order_whatever_its_items_layout() -> None:
    # A worker process writes batches in C order: threads must give the same layout.
    items = [np.asfortranarray(np.arange(6.0).reshape(2, 3) + n) for n in range(3)]
    batch = default_collate(items)
    assert batch.flags.c_contiguous
    assert batch.tolist() == [item.tolist() for item in items]
    big_endian = default_collate([np.arange(3, dtype=">i4"), np.arange(3, dtype=">i4")])
    assert big_endian.dtype.isnative
    assert big_endian.tolist() == [[0, 1, 2]] * 2


def test_containers_are_collated_per_field() -> None:
    batch = default_collate(
        [{"x": np.arange(2), "label": 1, "path": "a"}, {"x": np.arange(2), "label": 0, "path": "b"}]
    )
    assert batch["x"].shape == (2, 2)
    assert batch["label"].tolist() == [1, 0]
    assert batch["path"] == ["a", "b"]
    assert default_collate([(1, b"x"), (2, b"y")]) == (
        pytest.approx(np.array([1, 2])),
        [b"x", b"y"],
    )
    as_list = default_collate([[1, 2], [3, 4]])
    assert isinstance(as_list, list)
    assert [v.tolist() for v in as_list] == [[1, 3], [2, 4]]
    pair: Any = default_collate([Pair(1, "a"), Pair(2, "b")])
    assert pair._fields == Pair._fields
    assert repr(pair).startswith("Pair(")
    assert pair.x.tolist() == [1, 2]
    assert pair.name == ["a", "b"]


class Encoding(collections.UserDict[str, Any]):
    """A tokenizer's output (as transformers' ``BatchEncoding``): a dict with methods and
    state of its own."""

    def __init__(self, data: dict[str, Any], kind: str = "text") -> None:
        super().__init__(data)
        self.kind = kind

    def to(self, device: str) -> str:
        return f"{self.kind} on {device}"


class _OverDict(Mapping[str, Any]):
    """A mapping of the dict ``data``."""

    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


class Fields(_OverDict):
    """A read-only mapping whose type cannot be built from a dict."""

    def __init__(self, x: int, y: int) -> None:
        self.data = {"x": x, "y": y}


def test_a_batch_of_mappings_keeps_their_type_as_torch_does() -> None:
    # Each came out a plain dict, though the docstring says "the same container": a
    # tokenizer's output lost its `.to()`, an OrderedDict its type, a defaultdict its default.
    encoded: Any = default_collate(
        [Encoding({"ids": np.arange(3)}, "tokens"), Encoding({"ids": np.arange(3)})]
    )
    assert type(encoded) is Encoding
    assert encoded["ids"].shape == (2, 3)
    assert encoded.to("cuda") == "tokens on cuda"
    ordered = default_collate([collections.OrderedDict(b=1, a=2)] * 2)
    assert type(ordered) is collections.OrderedDict
    assert list(ordered) == ["b", "a"]
    assert ordered["a"].tolist() == [2, 2]
    counts: Any = default_collate([collections.defaultdict(int, n=1)] * 2)
    assert type(counts) is collections.defaultdict
    assert counts["n"].tolist() == [1, 1]
    assert counts["missing"] == 0
    frozen = default_collate([types.MappingProxyType({"x": 1})] * 2)
    assert type(frozen) is types.MappingProxyType
    assert frozen["x"].tolist() == [1, 1]
    plain = default_collate([Fields(1, 2), Fields(3, 4)])  # its type needs (x, y): a dict
    assert type(plain) is dict
    assert plain["y"].tolist() == [2, 4]
    item = Encoding({"ids": 1})
    default_collate([item, item])
    assert item["ids"] == 1  # the first item is not changed in place


class View(_OverDict, MutableMapping[str, Any]):
    """A mutable view of a dict it does not own: a shallow copy writes into the same dict."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        del self.data[key]


def test_a_mapping_whose_copy_writes_through_is_not_changed_by_its_batch() -> None:
    # Kept mapping types are built as torch builds them: a copy of the first item, updated.
    # A copy of this type shares the item's dict, so the update wrote the batch into the
    # dataset's own item: its second epoch read the first epoch's batches (torch does too).
    records = [View({"x": index}) for index in range(4)]

    class Records(SyncData):
        def __getitem__(self, index: int) -> Any:
            return records[index]

    with DataLoader(Records(4), batch_size=2) as loader:
        epochs = [[batch["x"].tolist() for batch in loader] for _ in range(2)]
    assert epochs == [[[0, 1], [2, 3]]] * 2
    assert [record["x"] for record in records] == [0, 1, 2, 3]


def test_bad_batches_raise_clearly() -> None:
    with pytest.raises(ValueError, match="different shapes"):
        default_collate([np.zeros(2), np.zeros(3)])
    with pytest.raises(TypeError, match="collate_fn=list"):
        default_collate([object()])
    with pytest.raises(TypeError, match="mixes dicts"):
        default_collate([{"a": 1}, 2])
    with pytest.raises(
        TypeError, match="sequence of 2 fields like the first one; item 1 of the batch has 1"
    ):
        default_collate([(1, 2), (1,)])
    # Keys that differ: one missing was a bare KeyError, one the first lacks dropped silently.
    with pytest.raises(TypeError, match=r"item 1 of the batch has other keys .*lacks \['b'\]"):
        default_collate([{"a": 1, "b": 2}, {"a": 3}])
    with pytest.raises(TypeError, match=r"item 2 of the batch has other keys .*adds \['b'\]"):
        default_collate([{"a": 1}, {"a": 2}, {"a": 3, "b": 4}])
    assert default_collate([{"a": 1, "b": 2}, {"b": 3, "a": 4}])["b"].tolist() == [2, 3]
    assert default_collate([]) == []


def test_an_item_that_is_not_an_array_among_arrays_is_named() -> None:
    # A __getitem__ or transform that returned None (a missing return) for one item said
    # "all input arrays must have the same shape", NumPy's words for another fault.
    with pytest.raises(TypeError, match=r"item 1 of a batch of arrays is a NoneType \(None\)"):
        default_collate([np.zeros(3), None, np.zeros(3)])
    with pytest.raises(TypeError, match=r"item 1 of a batch of arrays is a str \('x'\)"):
        default_collate([np.zeros(3), "x"])
    # What NumPy can stack still is, as torch stacks what it can make a tensor of.
    assert default_collate([np.zeros(2), [1.0, 2.0]]).tolist() == [[0, 0], [1, 2]]


def test_collate_fn_list_keeps_items_and_compose_chains_transforms() -> None:
    double = Compose([lambda i, x: x * 2, lambda i, x: (i, x)])
    with DataLoader(SyncData(5), batch_size=5, transform=double, collate_fn=list) as loader:
        assert next(iter(loader)) == [(i, 2 * i) for i in range(5)]
    with pytest.raises(TypeError, match="not callable"):
        Compose([1])  # type: ignore[list-item]
    assert "Compose" in repr(double)


def test_default_collate_of_bytes_keeps_a_list() -> None:
    class Blobs(SyncData):
        def __getitem__(self, index: int) -> Any:
            return bytes([index])

    with DataLoader(Blobs(3), batch_size=3, num_workers=1) as loader:
        assert next(iter(loader)) == [b"\x00", b"\x01", b"\x02"]


def test_numbers_mixed_with_strings_or_too_large_fail_their_batch() -> None:
    # [1, "a"] became the strings ["1", "a"], silently; an int too large for an array raised
    # StopIteration out of default_collate (which ended the epoch with num_workers=0).
    with pytest.raises(TypeError, match="a batch of int items holds a str"):
        default_collate([1, "a"])
    with pytest.raises(TypeError, match="a batch of float items holds a bytes"):
        default_collate([1.5, b"x"])
    with pytest.raises(ValueError, match="does not fit in an array"):
        default_collate([2**70, 1])
    with pytest.raises(TypeError, match="holds a NoneType"):
        default_collate([1, None])
    assert default_collate([1, 2.5]).dtype == np.float64  # numbers of two kinds still mix
