"""The examples run as shipped, and compute what they say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def run(script: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    return result.stdout


def losses(output: str) -> list[float]:
    return [float(value) for value in re.findall(r"^epoch \d+: mean loss ([\d.]+)$", output, re.M)]


def test_the_async_consumer_gets_every_item_in_order() -> None:
    assert run("async_consumer.py").strip() == "16 batches, 256 items, in order: True"


def test_the_training_loop_learns() -> None:
    per_epoch = losses(run("train_loop.py"))
    assert len(per_epoch) == 2
    assert per_epoch[-1] < per_epoch[0]


def test_the_image_training_loop_learns() -> None:
    per_epoch = losses(run("train_images.py"))
    assert len(per_epoch) == 3
    assert per_epoch[-1] < per_epoch[0] / 2


def test_the_shard_training_loop_learns_and_resumes_exactly() -> None:
    output = run("train_shards.py")
    per_epoch = losses(output)
    assert len(per_epoch) == 2
    assert per_epoch[-1] < per_epoch[0]
    assert re.search(r"^resumed after 5 batches: the same \d+ batches: True$", output, re.M)
