"""asyncloader against SPDL and torch DataLoader: throughput, time to the first batch, and the
peak memory of all processes, each system in a fresh process of its own, interleaved.

Workloads:
  tiny    200,000 in-memory items of 16 float32, batch 64.
  images  2,000 JPEGs of 320x240: Decode -> RandomResizedCrop(224) -> RandomHorizontalFlip ->
          ToFloat -> Normalize -> ToCHW, batch 64, 2 CPU threads / 2 workers.
Every system runs the same per-item code. SPDL: a ``spdl.pipeline`` with the map stage on 2
threads (``concurrency=2``, input order kept), aggregated into batches and collated the same
way. Memory: the total RSS of the process and its children, sampled every 10 ms.

Run: ``.venv/bin/python benches/bench_peers.py [--repeats R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _common import median, save, table

RUNNER = r"""
import json, sys, time
started = time.perf_counter()
sys.path.insert(0, {benches!r})
import numpy as np
from bench_images import Jpegs, TorchJpegs, chain, make_jpegs
from asyncloader import DataLoader, ImageCollator

system, workload = sys.argv[1], sys.argv[2]
if workload == "tiny":
    rows = np.random.default_rng(0).random((200_000, 16), dtype=np.float32)
    class Data:
        def __len__(self): return len(rows)
        def __getitem__(self, i): return rows[i]
    data, transform, collate = Data(), None, None
else:
    jpegs = make_jpegs(2000)
    data, transform = Jpegs(jpegs), chain()
    collate = ImageCollator(buffers=4)
first = None
count = 0
t0 = time.perf_counter()
if system == "asyncloader":
    workers = 0 if workload == "tiny" else 2
    loader = DataLoader(data, batch_size=64, transform=transform, collate_fn=collate,
                        num_workers=workers, item_concurrency=1 if workload == "tiny" else 2,
                        cpu_threads=2)
    for batch in loader:
        first = first or time.perf_counter() - t0
        count += len(batch)
    loader.close()
elif system == "torch":
    import torch
    torch.set_num_threads(1)
    dataset = TorchJpegs(jpegs) if workload == "images" else data
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=2)
    for batch in loader:
        first = first or time.perf_counter() - t0
        count += len(batch)
else:
    from spdl.pipeline import PipelineBuilder
    from asyncloader import default_collate
    fetch = (lambda i: transform(i, data[i])) if transform else data.__getitem__
    builder = (PipelineBuilder().add_source(range(len(data)))
               .pipe(fetch, concurrency=2, output_order="input")
               .aggregate(64).pipe(collate or default_collate).add_sink(3))
    pipeline = builder.build(num_threads=2)
    with pipeline.auto_stop():
        for batch in pipeline.get_iterator(timeout=600):
            first = first or time.perf_counter() - t0
            count += len(batch)
elapsed = time.perf_counter() - t0
print(json.dumps({{"items_per_s": count / elapsed, "first_batch_s": first,
                  "startup_s": t0 - started, "count": count}}))
"""


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/statm") as statm:
                total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
        todo += children.get(current, [])
    return total


def run(system: str, workload: str) -> dict[str, Any]:
    """One run in a fresh process; its figures, its peak and its memory over time."""
    code = RUNNER.format(benches=str(Path(__file__).parent))
    process = subprocess.Popen(
        [sys.executable, "-c", code, system, workload], stdout=subprocess.PIPE, text=True
    )
    timeline: list[tuple[float, int]] = []
    started = time.perf_counter()

    def sample() -> None:
        while process.poll() is None:
            timeline.append((time.perf_counter() - started, _tree_rss(process.pid)))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, _ = process.communicate(timeout=900)
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{system}/{workload} failed")
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    figures["peak_rss_mib"] = max((rss for _, rss in timeline), default=0) / 2**20
    figures["timeline"] = [(round(t, 3), round(rss / 2**20, 1)) for t, rss in timeline[::5]]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    systems = ("asyncloader", "torch", "spdl")
    results: dict[str, Any] = {}
    for workload in ("tiny", "images"):
        runs: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
        for _ in range(args.repeats):
            for system in systems:
                runs[system].append(run(system, workload))
        summary = {
            system: {
                key: median([r[key] for r in runs[system]])
                for key in ("items_per_s", "first_batch_s", "peak_rss_mib")
            }
            for system in systems
        }
        ours = summary["asyncloader"]
        print(f"\n### {workload}: items/s (median of {args.repeats} fresh processes each)\n")
        print(table([(s, summary[s]["items_per_s"], "") for s in systems]))
        for system in systems:
            figures = summary[system]
            print(
                f"- {system}: first batch {figures['first_batch_s'] * 1000:.0f} ms, "
                f"peak memory {figures['peak_rss_mib']:.0f} MiB"
            )
        ratios = {
            f"vs_{peer}": {
                "throughput": ours["items_per_s"] / summary[peer]["items_per_s"],
                "first_batch": ours["first_batch_s"] / summary[peer]["first_batch_s"],
                "peak_memory": ours["peak_rss_mib"] / summary[peer]["peak_rss_mib"],
            }
            for peer in ("torch", "spdl")
        }
        print(json.dumps(ratios, indent=1))
        results[workload] = {"runs": runs, "summary": summary, "ratios": ratios}
    print(f"\nresults: {save('peers', results)}")


if __name__ == "__main__":
    main()
