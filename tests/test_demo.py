"""``make demo`` runs ``python -m asyncloader demo``: it must stream a whole, ordered epoch."""

from __future__ import annotations

import re
import subprocess
import sys

from asyncloader._cli import main


def test_the_demo_streams_an_epoch_from_its_own_server() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "asyncloader", "demo", "--items", "640", "--in-flight", "16"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    match = re.search(r"(\d+) items in .* (\d+) requests in flight at peak", result.stdout)
    assert match, result.stdout
    assert int(match.group(1)) == 640
    assert int(match.group(2)) == 16  # the loader kept exactly the requests asked for in flight


def test_an_unknown_command_exits_with_status_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "asyncloader", "nonsense"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
    assert main(["bench", "ftp://host/x"]) == 2
