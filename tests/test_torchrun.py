"""A real multi-process run under torchrun: disjoint, complete shares; crash and resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("torchrun_job.py")
ROOT = JOB.parent.parent
SAMPLES = 48


def torchrun(processes: int, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={processes}",
        str(JOB),
        "--out",
        str(out),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)


def read(path: Path) -> list[int]:
    value: list[int] = json.loads(path.read_text())
    return value


@pytest.mark.timeout(600)
def test_torchrun_shares_crash_and_resume(tmp_path: Path) -> None:
    # 1. A whole epoch on 2 ranks: disjoint shares that cover the epoch.
    whole = torchrun(2, tmp_path, "--label", "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    shares = json.loads((tmp_path / "gathered-whole.json").read_text())
    assert len(shares) == 2
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(SAMPLES))

    # 2. The job crashes after 2 batches per rank, then restarts from its saved state.
    crash = torchrun(2, tmp_path, "--label", "crash", "--die-after", "2")
    assert crash.returncode != 0
    before = read(tmp_path / "received-crash-0.json") + read(tmp_path / "received-crash-1.json")
    assert len(before) == 2 * 2 * 4
    resumed = torchrun(2, tmp_path, "--label", "resumed", "--resume-from", "crash")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = [
        i for share in json.loads((tmp_path / "gathered-resumed.json").read_text()) for i in share
    ]
    assert sorted(before + after) == list(range(SAMPLES))  # each sample exactly once
    # The resumed job gave each rank the very batches the uninterrupted job would have.
    for rank in (0, 1):
        assert (
            read(tmp_path / f"received-crash-{rank}.json")
            + json.loads((tmp_path / "gathered-resumed.json").read_text())[rank]
            == shares[rank]
        )

    # 3. Elastic: the 2-rank state resumed by 1 rank finishes the epoch alone.
    elastic = torchrun(1, tmp_path, "--label", "elastic", "--resume-from", "crash")
    assert elastic.returncode == 0, elastic.stderr[-3000:]
    [alone] = json.loads((tmp_path / "gathered-elastic.json").read_text())
    assert sorted(before + alone) == list(range(SAMPLES))


@pytest.mark.timeout(600)
def test_torchrun_ranks_read_disjoint_shards_and_resume_them(tmp_path: Path) -> None:
    import io
    import tarfile

    folder = tmp_path / "shards"
    folder.mkdir()
    for shard in range(6):
        with tarfile.open(folder / f"{shard}.tar", "w") as archive:
            for i in range(8):
                info = tarfile.TarInfo(f"{shard * 8 + i:06d}.cls")
                info.size = 1
                archive.addfile(info, io.BytesIO(b"c"))
    every = list(range(48))
    whole = torchrun(2, tmp_path, "--label", "whole", "--shards", str(folder))
    assert whole.returncode == 0, whole.stderr[-3000:]
    shares = json.loads((tmp_path / "gathered-whole.json").read_text())
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == every
    crash = torchrun(2, tmp_path, "--label", "crash", "--die-after", "2", "--shards", str(folder))
    assert crash.returncode != 0
    args = ("--label", "resumed", "--resume-from", "crash", "--shards", str(folder))
    resumed = torchrun(2, tmp_path, *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = json.loads((tmp_path / "gathered-resumed.json").read_text())
    for rank in (0, 1):  # each rank goes on with the very batches it would have had
        assert read(tmp_path / f"received-crash-{rank}.json") + after[rank] == shares[rank]
