"""Running epochs in tests: every outcome in order (a batch or the error raised for it), and
the states ranks save part way through one."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from asyncloader import DataLoader


def outcomes(
    loader: DataLoader, value: Callable[[Any], Any], error: type[BaseException] = OSError
) -> list[Any]:
    """``value(batch)`` for each batch of one epoch, or the message of the ``error`` raised in
    its place (the epoch goes on after it)."""
    out: list[Any] = []
    iterator = iter(loader)
    while True:
        try:
            out.append(value(next(iterator)))
        except StopIteration:
            return out
        except error as raised:
            out.append(str(raised))


def rank_states(
    make: Callable[[int, int], DataLoader], ranks: int, batches: int, value: Callable[[Any], Any]
) -> tuple[list[dict[str, Any]], list[Any]]:
    """The states that ``ranks`` ranks (``make(rank, ranks)``) save after ``batches`` batches
    each (fewer where a rank's epoch ends first), through JSON, and ``value(item)`` for every
    item they received."""
    states, received = [], []
    for rank in range(ranks):
        with make(rank, ranks) as loader:
            iterator: Any = iter(loader)
            for batch in itertools.islice(iterator, batches):
                received += [value(item) for item in batch]
            states.append(loader.state_dict())
            iterator.close()
    return json.loads(json.dumps(states)), received
