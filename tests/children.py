"""Scripts run in a child process with a hard time-out, for what could hang, crash or change
the process (its limits), and what such a script sets for itself there."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parent.parent
"""Where the child runs, so that it imports ``tests.*`` as the tests do."""


INTERRUPTIBLE = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
"""The first lines of a child that is sent SIGINT. Python raises KeyboardInterrupt on SIGINT
only if it started with SIGINT's default action; a child of a test run that a script started
in the background (``cmd &``) starts with SIGINT ignored, and would never see it."""


def run_script(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``script`` (dedented) run by this Python with ``args``; its output as text."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def limit_address_space(more: int) -> tuple[int, int]:
    """In a child: allow ``more`` bytes of address space past what the process maps now, so
    that once the stacks of the threads it starts take them, the system starts no more (a
    thread or memory limit as a machine meets it); the limit it had."""
    with open("/proc/self/status") as status:
        found = re.search(r"VmSize:\s+(\d+)", status.read())
    assert found is not None
    before = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (int(found.group(1)) * 1024 + more, before[1]))
    return before
