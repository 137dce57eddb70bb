"""The CPUs the loader counts as its own: affinity, capped by a cgroup's CPU quota.

A real cgroup of the kernel's (v1, as this machine mounts the cpu controller) for the whole
path, and the kernel's file formats laid out in folders for the layouts a machine elsewhere
has (cgroup v2, a container's bind mount, odd contents).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncloader._cpus import available_cpus, cpu_quota

from .cgroups import v1_group

ROOT = Path(__file__).resolve().parent.parent
AFFINITY = len(os.sched_getaffinity(0))


def _in_group(group: Path, script: str | None = None) -> list[str]:
    """What a fresh process moved into ``group`` prints: by default, its CPU threads' default
    and the CPUs it counts."""
    script = textwrap.dedent(
        script
        or """
        from asyncloader import DataLoader
        from asyncloader._cpus import available_cpus
        print(DataLoader(list(range(8)), batch_size=2).cpu_threads, available_cpus())
        """
    )
    procs = str(group / "cgroup.procs")
    moved = f"import os\nwith open({procs!r}, 'w') as procs:\n    procs.write(str(os.getpid()))\n"
    done = subprocess.run(
        [sys.executable, "-c", moved + script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@contextlib.contextmanager
def _quota_group(quota_us: int) -> Iterator[Path]:
    """A real cgroup (v1) whose parent's CPU quota is ``quota_us`` a period of 100 ms."""
    with v1_group("cpu") as outer:
        (outer / "cpu.cfs_period_us").write_text("100000")
        (outer / "cpu.cfs_quota_us").write_text(str(quota_us))
        inner = outer / "inner"  # no quota of its own: the parent's caps it
        inner.mkdir()
        assert (inner / "cpu.cfs_quota_us").read_text().strip() == "-1"
        yield inner


@pytest.mark.parametrize(("quota_us", "expected"), [(100_000, 1), (150_000, 1), (50_000, 1)])
def test_a_cgroup_cpu_quota_caps_the_default_cpu_threads(quota_us: int, expected: int) -> None:
    """A container's CPU limit is a quota, not an affinity: the loader took every CPU of the
    machine for its threads (2 here, 96 on a node of 96 under an 8-CPU limit)."""
    with _quota_group(quota_us) as group:
        assert _in_group(group) == [str(min(AFFINITY, expected))] * 2


def test_a_transform_the_quota_holds_to_one_cpu_is_not_called_gil_bound() -> None:
    # Two CPU threads of a transform that releases the GIL (hashing), in a group of one CPU:
    # together they got one core, which the report took for a transform that holds the GIL
    # ("GIL-bound ... use cpu_processes"): processes would get no more.
    script = """
        import hashlib
        from asyncloader import DataLoader
        block = bytes(1 << 20)
        def digest(index, item):
            for _ in range(8):
                hashlib.sha256(block).digest()
            return item
        with DataLoader(
            list(range(96)), batch_size=4, num_workers=2, cpu_threads=2, transform=digest
        ) as loader:
            for _ in loader:
                pass
            stats = loader.stats()
        print(stats.gil_bound(), "GIL-bound" in stats.report())
        """
    with _quota_group(100_000) as group:
        assert _in_group(group, script) == ["False", "False"]


def test_no_quota_leaves_the_affinity() -> None:
    assert available_cpus() == AFFINITY  # this machine's groups set no quota
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})  # this thread's
    try:
        assert available_cpus() == 1
    finally:
        os.sched_setaffinity(0, before)


def _tree(folder: Path, files: dict[str, str], v2: bool = False) -> None:
    """Write ``files`` under ``folder``; ``v2``: each folder a cgroup v2 group, as the kernel
    shows one (its ``cgroup.controllers``)."""
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if v2:
            for group in (path.parent, *path.parent.parents):
                if group == folder or folder in group.parents:
                    (group / "cgroup.controllers").write_text("cpu memory\n")


def _quota(folder: Path, cgroup: str, mountinfo: str = "") -> int | None:
    _tree(folder, {"proc/cgroup": cgroup, "proc/mountinfo": mountinfo})
    return cpu_quota(str(folder / "proc/cgroup"), str(folder / "proc/mountinfo"), str(folder))


def test_cgroup_v2_takes_the_tightest_quota_of_the_group_and_its_ancestors(
    tmp_path: Path,
) -> None:
    _tree(
        tmp_path,
        {
            "cpu.max": "max 100000\n",
            "kubepods/cpu.max": "800000 100000\n",
            "kubepods/pod1/cpu.max": "max 100000\n",
            "kubepods/pod1/ctr/cpu.max": "1600000 100000\n",
        },
        v2=True,
    )
    assert _quota(tmp_path, "0::/kubepods/pod1/ctr\n") == 8
    assert _quota(tmp_path, "0::/kubepods/pod1\n") == 8
    assert _quota(tmp_path, "0::/\n") is None  # "max": no quota


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("150000 100000", 1),  # rounded down
        ("50000 100000", 1),  # at least one
        ("250000 50000", 5),
        ("max 100000", None),
        ("100000 0", None),
        ("-100000 100000", None),
        ("100000", None),
        ("\uff11\uff10\uff10 100000", None),  # digits, but not ASCII ones
        ("", None),
        ("\x00\xff", None),
    ],
)
def test_cgroup_v2_quota_as_written(tmp_path: Path, cpu_max: str, expected: int | None) -> None:
    _tree(tmp_path, {"job/cpu.max": cpu_max}, v2=True)
    assert _quota(tmp_path, "0::/job\n") == expected


def test_cgroup_v1_beside_v2_rules(tmp_path: Path) -> None:
    """A hybrid machine (this one): the line naming the cpu controller is the one to read."""
    _tree(
        tmp_path,
        {
            "cgroup.controllers": "",
            "cpu.max": "100000 100000",  # not the cpu controller's: v1 holds it
            "cpu/job/cpu.cfs_quota_us": "300000\n",
            "cpu/job/cpu.cfs_period_us": "100000\n",
            "cpu/cpu.cfs_quota_us": "-1\n",
            "cpu/cpu.cfs_period_us": "100000\n",
        },
    )
    cgroup = "9:cpuset:/other\n4:cpu:/job\n3:cpuacct:/job\n0::/\n"
    assert _quota(tmp_path, cgroup) == 3
    assert _quota(tmp_path, "4:cpu:/\n0::/\n") is None  # -1: none set


def test_cgroup_v1_in_a_containers_bind_mount(tmp_path: Path) -> None:
    """Docker's cgroup v1 without a cgroup namespace: /proc/self/cgroup names the host's path
    of the container's group, which is mounted as the hierarchy's top."""
    _tree(
        tmp_path,
        {
            "mnt/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
            "mnt/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    mounted = str(tmp_path / "mnt/cpu,cpuacct").replace(" ", "\\040")
    mountinfo = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        f"40 31 0:35 /docker/other {mounted} rw - cgroup cgroup rw,cpu,cpuacct\n"
        f"41 31 0:35 /docker/abc {mounted} rw,nosuid shared:20 - cgroup cgroup rw,cpuacct,cpu\n"
    )
    assert _quota(tmp_path, "5:cpu,cpuacct:/docker/abc\n", mountinfo) == 2


def test_a_path_with_a_space_in_mountinfo(tmp_path: Path) -> None:
    folder = tmp_path / "a folder"
    _tree(folder, {"cpu/cpu.cfs_quota_us": "400000", "cpu/cpu.cfs_period_us": "100000"})
    mountinfo = (
        "32 31 0:29 / " + str(folder / "cpu").replace(" ", "\\040") + " rw - cgroup cgroup rw,cpu"
    )
    _tree(tmp_path, {"proc/cgroup": "4:cpu:/\n", "proc/mountinfo": mountinfo})
    quota = cpu_quota(
        str(tmp_path / "proc/cgroup"), str(tmp_path / "proc/mountinfo"), str(tmp_path / "none")
    )
    assert quota == 4


@pytest.mark.parametrize(
    "cgroup",
    [
        "",
        "garbage",
        "4:cpu:relative/path\n",
        "4:cpu\n",
        "0::/nowhere\n",  # v2, but no cgroup2 there
        "4:cpu:/nowhere\n",  # v1, no such group in any mount
        "\xff\xfe",
    ],
)
def test_what_cannot_be_read_sets_no_quota(tmp_path: Path, cgroup: str) -> None:
    _tree(tmp_path, {"cpu/cpu.cfs_quota_us": "100000", "cpu/cpu.cfs_period_us": "100000"})
    assert _quota(tmp_path, cgroup, "garbage line\n1 2 3 - cgroup\n") is None
    missing = str(tmp_path / "missing")
    assert cpu_quota(missing, missing, missing) is None
    assert available_cpus(missing, missing, missing) == AFFINITY
