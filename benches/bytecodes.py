"""The Python each system runs per item, counted, not timed (docs/performance.md).

On a shared host the same loop's CPU per item moves by half within an hour, which hides the
few microseconds a change makes. This counts the bytecodes executed instead (``sys.settrace``
with opcode events, on every thread), over a second epoch after a first one has warmed every
path: deterministic to within a few bytecodes an item, and split by file and by function.
C code (the kernel, uvloop, memory copies) is not counted, so a count says where Python time
goes, not the whole cost.

Workloads: ``b`` is (b) at 256 in flight, 2,000 items (the bare aiohttp loop, and the loader
at 16x16 and 64x4); ``h`` is (h)'s 16 shards over HTTP (the bare streaming loop, TarShards
under ``async for``, and the loader).

Run: ``.venv/bin/python benches/bytecodes.py [b|h] [system ...] [--top N]``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import uvloop

from asyncloader import DataLoader, HttpDataset, TarShards, Template
from asyncloader.testing import serve_samples

from _bare import bare, stream_whole

ITEMS = 2000
SHARDS = 16
SYSTEMS = {"b": ("bare", "16x16", "64x4"), "h": ("bare", "direct", "loader")}


class Counter:
    """Bytecodes executed while it is on, by file and by function."""

    def __init__(self) -> None:
        self.files: collections.Counter[str] = collections.Counter()
        self.functions: collections.Counter[tuple[str, str]] = collections.Counter()

    def _global(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._local

    def _local(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            self.files[code.co_filename] += 1
            if "asyncloader" in code.co_filename:
                self.functions[code.co_filename.split("asyncloader/")[-1], code.co_name] += 1
        return self._local

    def count(self, run: Callable[[], object]) -> None:
        threading.settrace(self._global)
        sys.settrace(self._global)
        try:
            run()
        finally:
            sys.settrace(None)
            threading.settrace(None)


def _shown(path: str) -> str:
    if "site-packages/" in path:
        return "/".join(path.split("site-packages/")[-1].split("/")[:2])
    return path.split("asyncloader/")[-1] if "asyncloader/" in path else path


def _http_runs(url: str) -> dict[str, Callable[[], object]]:
    def loader(workers: int, concurrency: int) -> Callable[[], None]:
        def run() -> None:
            data = HttpDataset(Template(url + "/samples/{index}"), length=ITEMS)
            with DataLoader(
                data,
                batch_size=64,
                collate_fn=list,
                num_workers=workers,
                item_concurrency=concurrency,
            ) as batches:
                for _ in batches:
                    pass

        return run

    return {
        "bare": lambda: uvloop.run(bare(url, ITEMS, 256)),
        "16x16": loader(16, 16),
        "64x4": loader(64, 4),
    }


def _shard_runs(url: str) -> dict[str, Callable[[], object]]:
    urls = [f"{url}/shards/{n}.tar" for n in range(SHARDS)]

    async def direct() -> None:
        async for _ in TarShards(HttpDataset(urls), interleave=4):
            pass

    def loader() -> None:
        data = TarShards(HttpDataset(urls), interleave=4)
        with DataLoader(data, batch_size=64, num_workers=4, collate_fn=list) as batches:
            for _ in batches:
                pass

    return {
        "bare": lambda: uvloop.run(stream_whole(urls, 4, 16 * 1024 + 512, lambda n: None)),
        "direct": lambda: uvloop.run(direct()),
        "loader": loader,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload", choices=sorted(SYSTEMS))
    parser.add_argument("systems", nargs="*")
    parser.add_argument("--top", type=int, default=12, help="the functions shown")
    args = parser.parse_args()
    shards = args.workload == "h"
    per = SHARDS * 1000 if shards else ITEMS
    with serve_samples(0.020, 16 * 1024 // 4, shards=SHARDS if shards else 0) as url:
        runs = _shard_runs(url) if shards else _http_runs(url)
        for system in args.systems or SYSTEMS[args.workload]:
            runs[system]()  # the first epoch: imports, sessions, first-time paths
            counter = Counter()
            counter.count(runs[system])
            total = sum(counter.files.values())
            print(f"{system}: {total / per:,.0f} bytecodes an item")
            files: collections.Counter[str] = collections.Counter()
            for path, count in counter.files.items():
                files[_shown(path)] += count
            for name, count in files.most_common(12):
                print(f"  {count / per:8.1f}  {name}")
            for (name, function), count in counter.functions.most_common(args.top):
                print(f"  {count / per:8.1f}  {name}: {function}")


if __name__ == "__main__":
    main()
