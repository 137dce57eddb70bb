"""The loader's work as its worker processes get it: pickled once, when the loader is built,
with the modules it refers to (what the zygote imports); what cannot be pickled is named,
down to the attribute.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Final

from ._worker import Work
from ._zygote import IN_WORKER, pickle_with_modules


def _unpicklable(value: object, path: str, depth: int = 0) -> str:
    """The attribute path of ``value`` where pickling fails (the deepest one found)."""
    attributes = getattr(value, "__dict__", None)
    if depth < 4 and isinstance(attributes, dict):
        for name, attribute in attributes.items():
            try:
                pickle.dumps(attribute, protocol=5)
            except Exception:
                return _unpicklable(attribute, f"{path}.{name}", depth + 1)
    return path


@dataclass(frozen=True)
class PickledWork:
    """The loader's work as every worker gets it, and the modules the zygote imports for it."""

    data: bytes
    modules: list[str]
    main: bool
    """Whether it needs the main module (something in it was defined in a script)."""


def pickle_work(work: Work) -> PickledWork:
    """``work`` pickled once, for every worker the loader starts.

    Raises:
        TypeError: Part of it cannot be pickled; the message names the part and attribute.
        RuntimeError: This is a worker process, importing a script whose loader is not
            started under ``if __name__ == "__main__":``.
    """
    if os.environ.get(IN_WORKER):
        raise RuntimeError(UNGUARDED)
    try:
        data, modules, main = pickle_with_modules(work)
    except Exception as error:
        for name, value in (
            ("dataset", work.dataset),
            ("transform", work.transform),
            ("collate_fn", work.collate),
        ):
            try:
                pickle.dumps(value, protocol=5)
            except Exception as failed:
                raise TypeError(
                    f"cpu_processes: the {name} ({type(value).__name__}) cannot be sent to "
                    f"the worker processes; {_unpicklable(value, name)} cannot be pickled: "
                    f"{failed}"
                ) from failed
        raise TypeError(f"cpu_processes: the loader's work cannot be pickled: {error}") from error
    return PickledWork(data, modules, main)


UNGUARDED: Final = (
    "a DataLoader with cpu_processes was built while a worker process imported the main "
    "script: its workers import the script to find what it defines, so the script must "
    "build its loader under `if __name__ == '__main__':`"
)
