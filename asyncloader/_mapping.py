"""Memory maps that keep no descriptor of their own where Python allows it.

Before Python 3.13, ``mmap.mmap`` duplicates the descriptor it maps and keeps the copy while
the map lives, so each map held is a descriptor held: a consumer that keeps many (the items
of ``FileDataset(mmap=True)``, batches from worker processes) meets the process's limit
(``ulimit -n``). From 3.13, ``trackfd=False`` maps without one.
"""

from __future__ import annotations

import mmap
import sys
from typing import Final

KEEPS_DESCRIPTOR: Final = sys.version_info < (3, 13)
"""Whether each map keeps a descriptor open (Python before 3.13)."""


def map_fd(
    fd: int,
    length: int,
    flags: int = mmap.MAP_SHARED,
    prot: int = mmap.PROT_READ | mmap.PROT_WRITE,
) -> mmap.mmap:
    """``length`` bytes of ``fd`` mapped; the caller may close ``fd`` at once. The map's
    ``size()`` and ``resize()`` are not for use (from 3.13 they need the descriptor)."""
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, length, flags=flags, prot=prot, trackfd=False)
    return mmap.mmap(fd, length, flags=flags, prot=prot)
