"""Ctrl-C caught where Python drops exceptions: raised again once out of there.

An iterator dropped mid-epoch cancels its epoch from ``__del__`` and waits (bounded) for the
calls still running. Python prints and drops any exception that leaves ``__del__``, so a
Ctrl-C during that wait would be lost ("Exception ignored in ...") and the program would go
on. Raised again at once, it would land in ``__del__`` as well: a thread of its own sends
SIGINT to the main thread once the finalizer's frame has left that thread's stack (a signal,
not ``_thread.interrupt_main``, so that a sleep or a wait there ends at once, as Ctrl-C ends
it).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType
from typing import Final

_WAIT_S: Final = 10.0
"""How long the finalizer may take to return before the interrupt is raised anyway."""


def _on_stack(frame: FrameType, thread: int) -> bool:
    current = sys._current_frames().get(thread)
    while current is not None:
        if current is frame:
            return True
        current = current.f_back
    return False


def interrupt_after(frame: FrameType) -> None:
    """Raise ``KeyboardInterrupt`` in the main thread once ``frame`` (of a finalizer there)
    has returned."""
    main = threading.main_thread().ident
    assert main is not None

    def later() -> None:
        deadline = time.monotonic() + _WAIT_S
        while _on_stack(frame, main) and time.monotonic() < deadline:
            time.sleep(0.001)  # polls another thread's stack: no event says it returned
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=later, name="asyncloader-interrupt", daemon=True).start()
