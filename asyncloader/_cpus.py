"""The CPUs this process may use: its affinity, capped by its cgroup's CPU quota.

A container's CPU limit (Kubernetes' ``limits.cpu``, ``docker run --cpus``) is a quota of CPU
time, not an affinity: a pod limited to a few CPUs of a large node may run on all of them, so
``os.sched_getaffinity`` counts them all, and as many busy threads spend each period's quota
early in it, then all wait, the training loop's own thread with them. As the reference counts
(Rust's ``std::thread::available_parallelism``), the quota caps the count: whole CPUs, rounded
down, at least one, the tightest of the process's cgroup and its ancestors, v1 or v2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

_ESCAPED = re.compile(r"\\([0-7]{3})")
"""How ``/proc/self/mountinfo`` writes a space, tab, newline or backslash in a path."""


def available_cpus(
    cgroup: str = "/proc/self/cgroup",
    mountinfo: str = "/proc/self/mountinfo",
    root: str = "/sys/fs/cgroup",
) -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's CPU quota (the
    arguments say where the kernel's files are)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        count = os.cpu_count() or 1
    quota = cpu_quota(cgroup, mountinfo, root)
    return max(1, count if quota is None else min(count, quota))


def cpu_quota(cgroup: str, mountinfo: str, root: str) -> int | None:
    """The process's CPU quota in whole CPUs (rounded down, at least 1); ``None`` when its
    cgroups set none, or they cannot be read."""
    try:
        lines = Path(cgroup).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    v1 = v2 = None
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[2].startswith("/"):
            continue
        if fields[1] == "":
            v2 = fields[2][1:]
        elif "cpu" in fields[1].split(","):
            v1 = fields[2][1:]
    # A v1 line names its controllers: the cpu one rules where both are mounted (hybrid).
    if v1 is not None:
        quotas = list(_v1_quotas(v1, mountinfo, root))
    elif v2 is not None and Path(root, v2, "cgroup.controllers").is_file():
        quotas = [_v2_quota(Path(mount, "cpu.max")) for mount in _up(Path(root, v2), root)]
    else:
        return None
    found = [quota for quota in quotas if quota is not None]
    return max(1, min(found)) if found else None


def _up(start: Path, top: str | Path) -> Iterator[Path]:
    """``start`` and each folder above it, up to ``top`` (included)."""
    path, top = start, Path(top)
    while path == top or top in path.parents:
        yield path
        path = path.parent


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdecimal() and text.isascii() else None


def _v2_quota(path: Path) -> int | None:
    """``cpu.max``: ``"$MAX $PERIOD"``, ``MAX`` being ``max`` where no quota is set."""
    try:
        fields = path.read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(fields) != 2 or not all(f.isdecimal() and f.isascii() for f in fields):
        return None
    limit, period = int(fields[0]), int(fields[1])
    return limit // period if period > 0 else None


def _v1_quotas(group: str, mountinfo: str, root: str) -> Iterator[int | None]:
    """``cpu.cfs_quota_us // cpu.cfs_period_us`` of ``group`` and its ancestors (-1: none
    set), in the first mount of the cpu controller that holds the group."""
    for mount, inside in _v1_mounts(group, mountinfo, root):
        start = Path(mount, inside)
        if not start.is_dir():
            continue  # not this mount
        for path in _up(start, mount):
            limit = _number(path / "cpu.cfs_quota_us")
            period = _number(path / "cpu.cfs_period_us")
            yield limit // period if limit is not None and period else None
        return


def _v1_mounts(group: str, mountinfo: str, root: str) -> Iterator[tuple[str, str]]:
    """Where the cpu controller's hierarchy may be mounted, and the group's path within each:
    the usual places, then each mount ``/proc/self/mountinfo`` lists (a container's may be a
    bind mount of its own group, whose path then starts inside it)."""
    yield f"{root}/cpu", group
    yield f"{root}/cpu,cpuacct", group
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return
    for line in lines:
        # "ID PARENT MAJ:MIN ROOT MOUNT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER-OPTIONS"
        mounted, separator, filesystem = line.partition(" - ")
        fields, described = mounted.split(" "), filesystem.split(" ")
        if not separator or len(fields) < 5 or len(described) < 3:
            continue
        if described[0] != "cgroup" or "cpu" not in described[2].split(","):
            continue
        within = _unescaped(fields[3]).strip("/")
        if within and group != within and not group.startswith(within + "/"):
            continue  # a bind mount of another group
        yield _unescaped(fields[4]), group[len(within) :].lstrip("/")


def _unescaped(path: str) -> str:
    return _ESCAPED.sub(lambda match: chr(int(match.group(1), 8)), path)
