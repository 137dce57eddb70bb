"""Real cgroups (v1, as this machine mounts its controllers) for the tests of a container's
limits: made beneath this process's own group of a controller, removed after."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

_made = itertools.count()


@contextlib.contextmanager
def v1_group(controller: str) -> Iterator[Path]:
    """A new group of ``controller`` (``cpu``, ``memory``, ``pids``) beneath this process's
    own; the groups made in it are removed with it."""
    if os.geteuid() != 0:
        # The only skip of the suite: CI runs as root; another user cannot make a cgroup.
        pytest.skip("making a cgroup needs root (CI runs as root)")
    with open("/proc/self/cgroup") as lines:
        own = next(line for line in lines if controller in line.split(":")[1].split(","))
    group = Path("/sys/fs/cgroup", controller, own.split(":", 2)[2].strip().lstrip("/"))
    group /= f"asyncloader-test-{os.getpid()}-{next(_made)}"
    group.mkdir()
    try:
        yield group
    finally:
        for inner in [path for path in group.iterdir() if path.is_dir()]:
            inner.rmdir()
        group.rmdir()
