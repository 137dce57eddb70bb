"""A module that starts a thread when imported: the zygote that imports it must not fork."""

from __future__ import annotations

import os
import threading

threading.Thread(target=threading.Event().wait, name="imported-thread", daemon=True).start()


class Threads:
    """Item ``i`` is ``(i, threads in the process that fetched it)``."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, len(os.listdir("/proc/self/task"))
