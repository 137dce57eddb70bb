"""The benchmark suite (``make bench``): asyncloader against torch DataLoader and SPDL.

Workloads (issue 8): (a) tiny in-memory items, batch 64 (the loader's own overhead);
(b) 16 KiB items behind 20 ms from a local server, 16 to 256 requests in flight (limit:
in-flight / latency; at 256 the two cores are the limit, so a bare asyncio + aiohttp loop
measured in the same run is the reference); (c) JPEG decode + augmentation on 1, 2 and 4
threads (limit: threads x the single-core rate of the chain in a plain loop, at most 2
cores); (d) S3 on moto, 16 KiB objects (limit: obstore called directly); (e) 4 MiB files
(limit: a plain read loop); (f) the time to the first batch and (g) the peak memory of all
processes, of every run; (h) WebDataset tar shards of 16 KiB samples behind 20 ms and on moto
(TarShards against the webdataset package in torch's workers, against one request per sample,
and against a bare aiohttp loop that streams the shards whole); (i) a pure-Python transform
that holds the GIL and (j) a training step that holds it, over JPEG decoding: the CPU stage in
worker processes (``cpu_processes``) against threads and torch's persistent workers.

Every run is a fresh process (``_run.py``), so start-up, first batch and memory are its own;
the systems take turns run by run, and each figure is the median of ``--repeats`` runs, quoted
as a ratio to a peer and a fraction of the limit measured in the same suite run. Writes
``benches/results/suite.json`` (raw, not committed), ``benches/results/suite.md``, the plots
in ``docs/img/`` and the generated part of ``docs/performance.md``.

Run: ``make bench``, or ``.venv/bin/python benches/suite.py [--repeats R] [--only a,b,...]``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from asyncloader.testing import serve_samples

from _common import RESULTS, save

HERE = Path(__file__).parent
DOCS = HERE.parent / "docs"
LATENCY_S = 0.020
IN_FLIGHT = (16, 64, 128, 256)
THREADS = (1, 2, 4)
SHARDS = 16
SHARDS_OPEN = 4
"""(h): TarShards' interleave, and the bare loop's streams at once."""
GIL_SYSTEMS = ("asyncloader cpu_processes=2", "asyncloader cpu_threads=2", "torch num_workers=2")
"""(i) and (j): the CPU stage in processes, on threads, and torch's workers."""
PAGE = os.sysconf("SC_PAGE_SIZE")
KEEP_FREED_MEMORY = {
    "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": str(2**30),
}
"""glibc's settings that keep freed memory for reuse (docs/settings.md)."""


# Memory of a process tree -----------------------------------------------------------------


PSS_TICKS = 50
"""PSS is read every this many 10 ms ticks (memory in these runs rises to a plateau)."""


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * PAGE
        except OSError:
            pass
    return total


def _pss(pids: list[int]) -> int:
    """Proportional set size: pages shared between processes (fork) counted once."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def _held(pids: list[int]) -> int:
    """Memory the processes hold by descriptor alone, mapped in none of them (so in no RSS):
    the work a loader with ``cpu_processes`` pickled for its workers, counted once."""
    sizes: dict[int, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if "asyncloader-work" in os.readlink(path):
                    found = os.stat(path)
                    sizes[found.st_ino] = found.st_size
            except OSError:
                continue
    for pid in pids if sizes else []:  # a worker loading it maps it: its RSS has it
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    if "asyncloader-work" in line:
                        sizes.pop(int(line.split()[4]), None)
        except OSError:
            continue
    return sum(sizes.values())


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One run in a fresh process; its figures, peak memory and memory over time."""
    process = subprocess.Popen(
        [sys.executable, str(HERE / "_run.py"), json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **spec.get("env", {})},
    )
    timeline: list[tuple[float, float]] = []
    peaks = {"rss": 0, "pss": 0}
    started = time.perf_counter()

    def sample() -> None:
        # RSS every 10 ms from the known processes (10 us a read); the process tree (a scan
        # of all of /proc, ~0.9 ms here) every 100 ms; PSS every PSS_TICKS, and at most every
        # 100 ms while the RSS climbs past 5% over its last PSS read (so that a run shorter
        # than PSS_TICKS has its peak read too): a read walks the process's page tables,
        # 2.6 ms for one with torch loaded, and every 100 ms that took ~8% of a core from
        # three-process systems, which need both cores.
        ticks = 0
        pids: list[int] = []
        pss_tick, pss_rss = 0, 0
        while process.poll() is None:
            if ticks % 10 == 0:
                pids = _tree(process.pid)
            rss = _rss(pids)
            peaks["rss"] = max(peaks["rss"], rss)
            climbed = rss > 1.05 * pss_rss and ticks - pss_tick >= 10
            if ticks % PSS_TICKS == 0 or climbed:
                peaks["pss"] = max(peaks["pss"], _pss(pids) + _held(pids))
                pss_tick, pss_rss = ticks, rss
            if ticks % 10 == 0:
                timeline.append((round(time.perf_counter() - started, 2), round(rss / 2**20)))
            ticks += 1
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, _ = process.communicate(timeout=600)
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{spec['workload']}/{spec['system']} failed")
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    figures["peak_rss_mib"] = peaks["rss"] / 2**20
    figures["peak_pss_mib"] = peaks["pss"] / 2**20
    figures["timeline"] = timeline
    return figures


# Inputs each workload needs ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def moto_bucket(
    count: int, size: int, objects: dict[str, bytes] | None = None
) -> Iterator[dict[str, Any]]:
    """moto's S3 server in a process of its own, with ``count`` objects of ``size`` bytes
    (or the ``objects`` given)."""
    import boto3

    port = _free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="bench")
        blob = os.urandom(size)
        if objects is None:
            objects = {f"o/{i:05d}": blob for i in range(count)}
        for key, body in objects.items():
            # Readable without signing too: the webdataset peer and the bare loop GET the
            # objects by URL (with curl and aiohttp).
            client.put_object(Bucket="bench", Key=key, Body=body, ACL="public-read")
        client.close()
        yield {
            "keys": list(objects),
            "endpoint": endpoint,
            "options": {
                "endpoint": endpoint,
                "allow_http": True,
                "access_key_id": "testing",
                "secret_access_key": "testing",
                "region": "us-east-1",
            },
        }
    finally:
        server.terminate()
        server.wait(timeout=10)


def plan(only: set[str], folder: str, stack: ExitStack) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each workload's runs (one of each system and setting per repeat), inputs made."""
    workloads: list[tuple[str, list[dict[str, Any]]]] = []
    if "a" in only:
        base = {"workload": "tiny", "items": 200_000}
        workloads.append(
            (
                "a",
                [
                    {**base, "system": "asyncloader direct", "num_workers": 0},
                    {**base, "system": "asyncloader num_workers=2", "num_workers": 2},
                    {**base, "system": "torch num_workers=0", "num_workers": 0},
                    {**base, "system": "torch num_workers=2", "num_workers": 2},
                    # SPDL takes 50 s for 200,000 items here: 20,000 show its rate.
                    {**base, "system": "spdl", "items": 20_000},
                    {**base, "system": "plain loop"},
                ],
            )
        )
    if "b" in only:
        # 16 KiB items: 4,096 float32 each, from the demo's lean server.
        url = stack.enter_context(serve_samples(LATENCY_S, 16 * 1024 // 4))
        runs = []
        for in_flight in IN_FLIGHT:
            items = int(in_flight / LATENCY_S * 3)  # 3 s at the limit
            base = {"workload": "http", "url": url, "items": items, "in_flight": in_flight}
            # (in-flight / 4, 4) at every point; at 64 and 256 also the other ways to split the
            # same requests in flight between num_workers and item_concurrency (issue 19).
            splits = {64: (64, 32, 4, 16), 256: (4, 16)}.get(in_flight, (4,))
            for lanes in splits:
                workers = max(1, in_flight // lanes)
                runs.append(
                    {
                        **base,
                        "system": "asyncloader",
                        "num_workers": workers,
                        "item_concurrency": lanes,
                    }
                )
            runs += [{**base, "system": s} for s in ("bare aiohttp", "spdl")]
        # torch: a blocking request per worker process: 8 in flight with 8 workers; 2 workers
        # for the first batch's goal, which is stated against num_workers=2.
        torch_base = {"workload": "http", "url": url, "items": 640, "in_flight": 8}
        runs.append({**torch_base, "system": "torch", "num_workers": 8})
        runs.append({**torch_base, "system": "torch", "num_workers": 2, "items": 256})
        workloads.append(("b", runs))
    if "c" in only:
        from bench_images import make_jpegs

        jpegs = os.path.join(folder, "jpegs.pickle")
        with open(jpegs, "wb") as file:
            pickle.dump(make_jpegs(2000), file)
        plain = {"workload": "images", "jpegs": jpegs, "system": "plain loop", "threads": 1}
        # The same plain loop in two processes: what both cores give at the time, with no
        # GIL; the host does not always give this VM two whole cores.
        runs = [plain, {**plain, "system": "plain loop, 2 processes", "threads": 2}]
        for threads in THREADS:
            base = {"workload": "images", "jpegs": jpegs, "threads": threads}
            runs += [{**base, "system": s} for s in ("asyncloader", "torch", "spdl")]
            if threads == 2:  # what normalizing while collating gains, in the same run
                runs.append({**base, "system": "asyncloader, normalized per item"})
                # The CPU stage in 2 worker processes instead, against threads, each over
                # two epochs: the first from a fresh process, the second warm (issue 21).
                runs.append({**base, "system": "asyncloader cpu_processes", "epochs": 2})
                runs.append({**base, "system": "asyncloader", "epochs": 2})
        workloads.append(("c", runs))
    if "j" in only and "c" not in only:
        from bench_images import make_jpegs

        jpegs = os.path.join(folder, "jpegs.pickle")
        with open(jpegs, "wb") as file:
            pickle.dump(make_jpegs(2000), file)
    if "i" in only:
        gil = {"workload": "gil", "items": 12_288}
        workloads.append(
            (
                "i",
                [
                    {**gil, "system": s}
                    for s in (*GIL_SYSTEMS, "plain loop", "plain loop, 2 processes")
                ],
            )
        )
    if "j" in only:
        train = {"workload": "train", "jpegs": os.path.join(folder, "jpegs.pickle")}
        workloads.append(("j", [{**train, "system": s} for s in GIL_SYSTEMS]))
    if "d" in only:
        bucket = stack.enter_context(moto_bucket(1024, 16 * 1024))
        # Each object 4 times: 64 batches, so that 16 batches in work reach a steady rate.
        base = {"workload": "s3", **bucket, "keys": bucket["keys"] * 4}
        systems = ("asyncloader", "obstore alone", "spdl")
        runs = [{**base, "system": s} for s in systems]
        runs.append({**base, "system": "torch", "num_workers": 8})
        workloads.append(("d", runs))
    if "e" in only:
        files = os.path.join(folder, "files")
        os.mkdir(files)
        for i in range(64):
            with open(os.path.join(files, f"{i:03d}.bin"), "wb") as file:
                file.write(os.urandom(4 * 2**20))
        # Written now, read last: by then the kernel caches them in 4 KiB pages, as it does
        # files written long before a training job reads them (docs/performance.md, (e)).
        base = {"workload": "files", "folder": files}
        readers = (
            "asyncloader",
            "asyncloader, mmap=True",
            "plain loop",
            "plain loop, batches held",
            "spdl",
        )
        runs = [{**base, "system": s} for s in readers]
        # The settings guide's allocator setting for large items, given to each system that
        # keeps batches alive: glibc then reuses freed batches' memory instead of returning
        # it to the kernel and faulting fresh pages in for the next batch.
        kept = {**base, "env": KEEP_FREED_MEMORY}
        runs.append({**kept, "system": "asyncloader"})
        runs.append({**kept, "system": "plain loop, batches held"})
        runs.append({**base, "system": "torch", "num_workers": 2})
        workloads.append(("e", runs))
    if "h" in only:
        from asyncloader._samples import shard

        # 16 shards of 1,000 samples of 16 KiB, each read 4 times (3 times from moto).
        url = stack.enter_context(serve_samples(LATENCY_S, 16 * 1024 // 4, shards=SHARDS))
        urls = [f"{url}/shards/{n}.tar" for n in range(SHARDS)] * 4
        base = {"workload": "shards", "url": url, "urls": urls, "in_flight": SHARDS_OPEN}
        objects = {f"shards/{n:04d}.tar": shard(n, 16 * 1024 // 4) for n in range(SHARDS)}
        bucket = stack.enter_context(moto_bucket(0, 0, objects))
        keys = list(objects) * 3
        moto = {
            **base,
            "urls": [f"{bucket['endpoint']}/bench/{key}" for key in keys],
            "keys": keys,
            "bucket": "bench",
            "store_options": bucket["options"],
            "on": "moto",
        }
        runs = []
        for where in (base, moto):
            runs += [
                {**where, "system": "asyncloader", "num_workers": 4},
                {**where, "system": "bare aiohttp"},
                {**where, "system": "webdataset", "num_workers": 2},
                {**where, "system": "webdataset", "num_workers": 8},
            ]
        # The bare loop reads into fresh pages or reuses freed ones from run to run (glibc's
        # choice), which moves it by up to 2.5x: both again with freed memory kept.
        kept = {**base, "env": KEEP_FREED_MEMORY}
        runs += [
            {**kept, "system": "asyncloader", "num_workers": 4},
            {**kept, "system": "bare aiohttp"},
        ]
        # One request per sample, 64 in flight, for 3 s at their limit.
        runs.append({**base, "system": "asyncloader, a request per sample", "items": 9600})
        workloads.append(("h", runs))
    return workloads


def label(spec: dict[str, Any]) -> str:
    """A run's system and setting, as tables show it."""
    if spec["workload"] == "shards":
        where = ", moto" if spec.get("on") == "moto" else ""
        where += ", freed memory kept" if "env" in spec else ""
        if spec["system"] == "webdataset":
            return f"webdataset + torch num_workers={spec['num_workers']}{where}"
        return f"{spec['system']}{where}"
    if spec["workload"] == "http" and spec["system"] == "asyncloader":
        if spec["item_concurrency"] == 4:  # the series of the plot
            return f"asyncloader @{spec['in_flight']}"
        return f"asyncloader {spec['num_workers']}x{spec['item_concurrency']} @{spec['in_flight']}"
    if spec["workload"] == "http" and spec["system"] != "torch":
        return f"{spec['system']} @{spec['in_flight']}"
    if spec["workload"] == "images" and not spec["system"].startswith("plain loop"):
        twice = ", 2 epochs" if spec.get("epochs") == 2 else ""
        return f"{spec['system']} x{spec['threads']}{twice}"
    if "env" in spec:
        return f"{spec['system']}, freed memory kept"
    if spec["system"] == "torch" and "num_workers" in spec:
        return f"torch num_workers={spec['num_workers']}"
    return str(spec["system"])


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def compile_modules() -> None:
    """Byte-compile asyncloader and the benches' modules, as installing a wheel does.

    An editable install under ``PYTHONDONTWRITEBYTECODE`` (or a fresh clone) has no bytecode
    cached, so every run, and every worker process it starts, would compile asyncloader's
    modules again before its first batch, which torch's installed modules never do.
    """
    import asyncloader

    for folder in (Path(asyncloader.__file__).parent, HERE):
        compileall.compile_dir(folder, quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="a,b,c,d,e,h,i,j", help="workloads, e.g. a,c")
    args = parser.parse_args()
    only = set(args.only.split(","))
    compile_modules()
    results: dict[str, Any] = {"repeats": args.repeats, "workloads": {}}
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        for key, specs in plan(only, folder, stack):
            started = time.perf_counter()
            runs: dict[str, list[dict[str, Any]]] = {label(s): [] for s in specs}
            for repeat in range(args.repeats):
                for spec in specs:
                    figures = run(spec)
                    runs[label(spec)].append(figures)
                    print(
                        f"({key}) {label(spec)}: {figures['per_s']:,.0f}/s, "
                        f"peak {figures['peak_rss_mib']:.0f} MiB [{repeat + 1}/{args.repeats}]",
                        flush=True,
                    )
            results["workloads"][key] = {
                name: {
                    "per_s": median_of(r, "per_s"),
                    "first_batch_s": median_of(r, "first_batch_s"),
                    "peak_rss_mib": median_of(r, "peak_rss_mib"),
                    "peak_pss_mib": median_of(r, "peak_pss_mib"),
                    "gc_young": median_of(r, "gc_young"),
                    "warm_per_s": median_of(r, "warm_per_s"),
                    "runs": r,
                }
                for name, r in runs.items()
            }
            print(f"({key}: {time.perf_counter() - started:.0f} s)", flush=True)
    from _report import write_report

    path = save("suite", results)
    write_report(results, RESULTS / "suite.md", DOCS)
    print(f"\nresults: {path}, {RESULTS / 'suite.md'}, docs/performance.md, docs/img/")


if __name__ == "__main__":
    main()
