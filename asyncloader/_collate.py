"""``default_collate``: turn a batch's items into one value, NumPy first.

Arrays and numbers are stacked with NumPy; torch tensors with ``torch.stack`` (torch is only
touched when an item is a tensor, so it stays optional); dicts, tuples, lists and namedtuples
are collated field by field; text and bytes-like items are kept as lists.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from . import _shared as shared

_KEPT_AS_LIST = (str, bytes, bytearray, memoryview)
_NUMBERS = (bool, int, float, complex, np.number, np.bool_)


def _is_tensor(item: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(item, torch.Tensor)


def default_collate(items: Sequence[Any] | np.ndarray[Any, Any]) -> Any:
    """Collate a batch's items into one value.

    Args:
        items: The batch's items, all of the same structure (a list, or any sequence of them:
            an array's rows, a range).

    Returns:
        A stacked array for arrays and numbers, a stacked tensor for tensors, the same
        container for dicts (their mapping type kept as torch keeps it, else a dict),
        tuples, lists and namedtuples (collated per field), other
        sequences collated element-wise (into their type when it can be built from a list,
        else a list), or a list for ``str`` and bytes-like items.

    Raises:
        TypeError: The items have no collation rule, or differ in type or structure (dicts
            of other keys than the first item's, sequences of another length).
        ValueError: Arrays of different shapes.
    """
    if len(items) == 0:  # `not items` is ambiguous for an array of items
        return []
    if not isinstance(items, list | tuple):
        items = list(items)  # an array, a range or another sequence of items
    first = items[0]
    if isinstance(first, np.ndarray):
        shapes = {item.shape for item in items if isinstance(item, np.ndarray)}
        if len(shapes) > 1:
            raise ValueError(f"default_collate: arrays of different shapes {sorted(shapes)}")
        out = None  # in a worker process, the batch is written into shared memory
        if shared.in_worker() and all(type(item) is np.ndarray for item in items):
            dtype = np.result_type(*{item.dtype for item in items})
            out = shared.empty((len(items), *first.shape), dtype)
        try:
            batch = np.stack(items, out=out)
        except (TypeError, ValueError):
            # NumPy's words fit arrays; an item that is not one (None, say) is named instead.
            odds = [n for n, item in enumerate(items) if not isinstance(item, np.ndarray)]
            if not odds:
                raise
            odd = odds[0]
            raise TypeError(
                f"default_collate: item {odd} of a batch of arrays is a "
                f"{type(items[odd]).__name__} ({_shown(items[odd])})"
            ) from None
        # In C order whatever the items' layout, as a worker process writes it: one layout
        # in every mode (a copy only for such items, Fortran-ordered ones).
        return batch if batch.flags.c_contiguous else np.ascontiguousarray(batch)
    if isinstance(first, _NUMBERS):
        batch = np.asarray(items)
        if batch.dtype.kind not in "biufc":  # no silent object or string array
            odds = [item for item in items if not isinstance(item, _NUMBERS)]
            if not odds:  # numbers all, one of them an int too large for NumPy's
                raise ValueError(
                    f"default_collate: a batch of {type(first).__name__} items holds one that "
                    "does not fit in an array of numbers (an int of over 64 bits)"
                )
            raise TypeError(
                f"default_collate: a batch of {type(first).__name__} items holds a "
                f"{type(odds[0]).__name__} ({_shown(odds[0])})"
            )
        return batch
    if isinstance(first, _KEPT_AS_LIST):
        return list(items)
    if _is_tensor(first):
        import torch

        return torch.stack(list(items))
    if isinstance(first, Mapping):
        _same_keys(items)
        collated = {key: default_collate([_field(item, key) for item in items]) for key in first}
        return same_mapping(first, collated)
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple
        return type(first)(*default_collate_fields(items, len(first)))
    if isinstance(first, tuple | list):
        fields = default_collate_fields(items, len(first))
        return tuple(fields) if isinstance(first, tuple) else fields
    if isinstance(first, Sequence):  # a range, or any other sequence: element-wise, as torch
        fields = default_collate_fields([list(item) for item in _sequences(items)], len(first))
        try:
            return type(first)(fields)  # type: ignore[call-arg]
        except TypeError:  # a sequence type that cannot be built from a list (range)
            return fields
    raise TypeError(
        f"default_collate cannot collate items of type {type(first).__name__}; "
        "pass collate_fn=list to keep the items as they are"
    )


def same_mapping(model: Mapping[Any, Any], fields: dict[Any, Any]) -> Any:
    """``fields`` in ``model``'s mapping type, as torch's collate and pinning build it: a copy
    of ``model`` updated when the type is mutable (it may hold more than its keys, as a
    tokenizer's output does), else the type built from a dict; a dict when neither can be."""
    if type(model) is dict:
        return fields
    try:
        if isinstance(model, MutableMapping):
            kept = dict(model)
            clone = copy.copy(model)
            clone.update(fields)
            if any(model[key] is not value for key, value in kept.items()):
                # The copy shares the item's storage: the update wrote into the item (a
                # dataset's own record, read again next epoch). It is put back as it was.
                model.update(kept)
                return fields
            return clone
        return type(model)(fields)  # type: ignore[call-arg]
    except TypeError:
        return fields


def _sequences(items: Sequence[Any]) -> Sequence[Any]:
    for item in items:
        if isinstance(item, str | bytes | bytearray) or not isinstance(item, Sequence):
            raise TypeError(f"default_collate: a batch mixes sequences and {type(item).__name__}")
    return items


def _same_keys(items: Sequence[Any]) -> None:
    """Refuse dicts whose keys are not the first one's: a key missing from one would fail
    as a bare ``KeyError``, and one the first lacks would be dropped with no word."""
    keys = items[0].keys()
    for position, item in enumerate(items):
        if isinstance(item, Mapping) and item.keys() != keys:
            missing = [key for key in keys if key not in item]
            extra = [key for key in item if key not in keys]
            said = "; ".join(
                f"{what} {_shown(found)}"
                for what, found in (("lacks", missing), ("adds", extra))
                if found
            )
            raise TypeError(
                f"default_collate: item {position} of the batch has other keys than the first: "
                f"it {said}"
            )


def _field(item: object, key: object) -> Any:
    if not isinstance(item, Mapping):
        raise TypeError(f"default_collate: a batch mixes dicts and {type(item).__name__}")
    return item[key]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def default_collate_fields(items: Sequence[Any], width: int) -> list[Any]:
    """Collate sequences of ``width`` fields position by position."""
    for position, item in enumerate(items):
        if not isinstance(item, tuple | list):
            raise TypeError(
                f"default_collate: each item must be a sequence of {width} fields like the "
                f"first one, got {type(item).__name__}"
            )
        if len(item) != width:
            raise TypeError(
                f"default_collate: each item must be a sequence of {width} fields like the "
                f"first one; item {position} of the batch has {len(item)}"
            )
    return [default_collate([item[position] for item in items]) for position in range(width)]


class unbatched:
    """With ``batch_size=None`` each "batch" is one item, handed to ``collate_fn`` alone (by
    default the item as it is: NumPy-first, nothing to convert). A class, not a closure, so
    that it can be sent to worker processes."""

    def __init__(self, collate_fn: Callable[[Any], Any] | None) -> None:
        self.collate_fn = collate_fn

    def __call__(self, items: list[Any]) -> Any:
        if not items:  # errors="skip" dropped the item
            return []
        return items[0] if self.collate_fn is None else self.collate_fn(items[0])
