"""Plots for docs/performance.md, drawn from benches/results/*.json (run the benches first).

- ``http_in_flight.png``: items/s against requests in flight (HttpDataset, bare aiohttp, the
  in-flight / latency limit), from ``datasets-http.json`` or ``datasets.json``.
- ``cpu_threads.png``: images/s of the augmentation chain against ``cpu_threads``, from
  ``images.json``.
- ``memory_over_time.png``: total RSS of all processes over a run of the image workload, for
  asyncloader, torch DataLoader and SPDL, from ``peers.json``.

Run: ``.venv/bin/python benches/plots.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt

RESULTS = Path(__file__).parent / "results"
IMAGES = Path(__file__).parent.parent / "docs" / "img"


def _load(*names: str) -> dict[str, Any] | None:
    for name in names:
        path = RESULTS / f"{name}.json"
        if path.exists():
            loaded: dict[str, Any] = json.loads(path.read_text())
            return loaded
    return None


def http_in_flight() -> Path | None:
    """Items/s against requests in flight."""
    results = _load("datasets-http", "datasets")
    if results is None:
        return None
    http = results.get("http", results)
    points = sorted(int(key.rsplit("_", 1)[1]) for key in http if key.startswith("in_flight_"))
    if not points:
        return None
    latency = results.get("latency_s", 0.020)
    figure, axes = plt.subplots(figsize=(6, 4))
    series = {
        "asyncloader HttpDataset (best shape)": [
            max(
                http[f"in_flight_{p}"]["medians"].get(name, 0.0)
                for name in ("asyncloader HttpDataset", "asyncloader HttpDataset, 16 batches")
            )
            for p in points
        ],
        "bare asyncio + aiohttp": [
            http[f"in_flight_{p}"]["medians"]["bare asyncio + aiohttp"] for p in points
        ],
        "limit (in flight / 20 ms)": [p / latency for p in points],
    }
    for label, values in series.items():
        axes.plot(
            points, values, marker="o", label=label, linestyle="--" if "limit" in label else "-"
        )
    return _save(
        figure,
        axes,
        "http_in_flight.png",
        title="16 KiB items behind 20 ms, 2 cores",
        x="requests in flight",
        y="items/s",
    )


def memory_over_time() -> Path | None:
    """RSS of all processes over a run of the image workload."""
    results = _load("peers")
    if results is None or "images" not in results:
        return None
    figure, axes = plt.subplots(figsize=(6, 4))
    for system, runs in results["images"]["runs"].items():
        timeline = runs[0]["timeline"]
        axes.plot([t for t, _ in timeline], [rss for _, rss in timeline], label=system)
    return _save(
        figure,
        axes,
        "memory_over_time.png",
        title="2,000 JPEGs, decode + augment, 2 threads / 2 workers",
        x="seconds since the process started",
        y="RSS of all processes (MiB)",
    )


def cpu_threads() -> Path | None:
    """Images/s of the augmentation chain against the CPU pool's threads."""
    results = _load("images")
    if results is None or "medians_by_cpu_threads" not in results:
        return None
    medians = results["medians_by_cpu_threads"]
    threads = sorted(medians, key=int)
    one_core = results["medians"]["the chain on one core"]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(
        [int(t) for t in threads], [medians[t] for t in threads], marker="o", label="asyncloader"
    )
    axes.plot(
        [int(t) for t in threads],
        [one_core * min(int(t), 2) for t in threads],
        linestyle="--",
        label="limit: one core's rate x min(threads, 2 cores)",
    )
    return _save(
        figure,
        axes,
        "cpu_threads.png",
        title="JPEG decode + augment, 2 cores",
        x="cpu_threads",
        y="images/s",
    )


def _save(figure: Any, axes: Any, name: str, *, title: str, x: str, y: str) -> Path:
    """Label, write and close one plot."""
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.set_title(title)
    axes.legend()
    axes.grid(alpha=0.3)
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / name
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main() -> None:
    for draw in (http_in_flight, memory_over_time, cpu_threads):
        path = draw()
        print(f"{draw.__name__}: {path if path else 'no results yet'}")


if __name__ == "__main__":
    main()
