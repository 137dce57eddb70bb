"""The examples run as shipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("script", ["async_consumer.py", "train_loop.py", "train_images.py"])
def test_example_runs(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "batches" in result.stdout or "mean loss" in result.stdout
