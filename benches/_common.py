"""Shared by the benchmarks: interleaved repeats, medians, ratios, and the results file.

This machine is noisy, so systems are run in turns (A, B, A, B, ...) and compared by the ratio
of medians taken in the same run, never against a figure from another run.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def interleave(systems: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run each system's measurement ``repeats`` times, in turns; return every figure."""
    figures: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name, measure in systems.items():
            figures[name].append(measure())
    return figures


def median(values: list[float]) -> float:
    """The median of ``values``."""
    return statistics.median(values)


def timed(fn: Callable[[], int]) -> float:
    """Items per second of ``fn``, which returns how many items it processed."""
    start = time.perf_counter()
    items = fn()
    return items / (time.perf_counter() - start)


def save(name: str, results: dict[str, Any]) -> Path:
    """Write ``results`` with the machine's description to ``benches/results/{name}.json``."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    results = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        **results,
    }
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path


def table(rows: list[tuple[str, float, str]]) -> str:
    """A Markdown table of ``(system, items/s, note)`` rows."""
    lines = ["| system | items/s (median) | note |", "|---|---:|---|"]
    lines += [f"| {name} | {value:,.0f} | {note} |" for name, value, note in rows]
    return "\n".join(lines)
