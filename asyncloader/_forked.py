"""What a forked process must not keep: the ends of the sockets between the loader and its
worker processes.

Each side sees the other go as its socket's end. The workers' server (the zygote) and each
worker exit once the loader's end closes: the loader closed, or its process died. A process
forked from the loader's (a worker of torch's ``DataLoader``, a process of a ``fork`` pool)
gets copies of those ends; were it to keep them, the zygote and the workers, and the work
loaded in them, would outlive a killed loader for as long as that process lives. Likewise the
loader sees a worker die as the worker's end closes, which a process forked by the user's
code in the worker would hold open. A forked process closes its copies as it starts (a loader
used there starts processes of its own).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Protocol


class _End(Protocol):
    def close(self) -> None: ...


_ENDS: weakref.WeakSet[_End] = weakref.WeakSet()


def parents_only(*ends: _End) -> None:
    """Have every process forked from this one close ``ends`` (sockets, connections) as it
    starts."""
    _ENDS.update(ends)


def _close_in_child() -> None:
    ends = list(_ENDS)
    _ENDS.clear()
    for end in ends:
        with contextlib.suppress(OSError):
            end.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)
