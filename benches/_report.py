"""The suite's report: ratios, goals, Markdown tables, plots, and docs/performance.md.

Every ratio is between medians of the same suite run (the systems took turns run by run).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARK_START = "<!-- suite:start (written by benches/suite.py) -->"
MARK_END = "<!-- suite:end -->"

Goal = tuple[str, float | None, str, float]
"""(what, figure, ``"≥"`` or ``"≤"``, the bound)."""


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:,.0f} ms"


def _table(
    rows: dict[str, Any], names: list[str], unit: str, extra: dict[str, dict[str, str]]
) -> str:
    columns = sorted({column for notes in extra.values() for column in notes})
    head = f"| system | {unit} | " + " | ".join(columns) + " | first batch | peak RSS (PSS) |"
    lines = [head, "|---|---:|" + "---:|" * len(columns) + "---:|---:|"]
    for name in names:
        if name not in rows:
            continue
        row = rows[name]
        cells = [extra.get(name, {}).get(column, "") for column in columns]
        lines.append(
            f"| {name} | {row['per_s']:,.0f} | "
            + " | ".join(cells)
            + f" | {_ms(row['first_batch_s'])} | "
            f"{row['peak_rss_mib']:,.0f} ({row['peak_pss_mib']:,.0f}) MiB |"
        )
    return "\n".join(lines)


def sections(results: dict[str, Any]) -> tuple[list[str], list[Goal]]:
    """The Markdown of each workload, and the goals with their figures."""
    out: list[str] = []
    goals: list[Goal] = []
    work = results["workloads"]
    repeats = results["repeats"]

    def per_s(key: str, name: str) -> float | None:
        row = work.get(key, {}).get(name)
        return None if row is None else row["per_s"]

    def first(key: str, name: str) -> float | None:
        row = work.get(key, {}).get(name)
        return None if row is None else row["first_batch_s"]

    if "a" in work:
        rows = work["a"]
        limit = per_s("a", "plain loop")
        extra = {name: {"of the limit": _fmt(_ratio(rows[name]["per_s"], limit))} for name in rows}
        direct = _ratio(per_s("a", "asyncloader direct"), per_s("a", "torch num_workers=0"))
        workers = _ratio(per_s("a", "asyncloader num_workers=2"), per_s("a", "torch num_workers=2"))
        extra["asyncloader direct"]["vs peer"] = f"**{_fmt(direct)}×** torch nw=0"
        extra["asyncloader num_workers=2"]["vs peer"] = f"**{_fmt(workers)}×** torch nw=2"
        spdl = _ratio(per_s("a", "asyncloader direct"), per_s("a", "spdl"))
        extra["spdl"]["vs peer"] = f"direct path {_fmt(spdl, 1)}× it"
        out.append(
            "### (a) Tiny in-memory items: the loader's own overhead\n\n"
            "200,000 items of 16 float32, batch 64, stacked into one array. Limit: the same "
            "fetch and stack in a plain loop.\n\n" + _table(rows, list(rows), "items/s", extra)
        )
        goals.append(("(a) direct path ÷ torch num_workers=0", direct, "≥", 2))
        goals.append(("(a) num_workers=2 ÷ torch num_workers=2", workers, "≥", 2))
        for ours in ("asyncloader direct", "asyncloader num_workers=2"):
            goals.append(
                (
                    f"(f) first batch, tiny items: {ours} ÷ torch num_workers=2",
                    _ratio(first("a", ours), first("a", "torch num_workers=2")),
                    "≤",
                    0.1,
                )
            )
    if "b" in work:
        rows = work["b"]
        extra = {}
        for name in rows:
            if "@" in name:
                in_flight = int(name.rsplit("@", 1)[1])
                limit = in_flight / 0.020
                notes = {"of the limit": _fmt(rows[name]["per_s"] / limit)}
                if rows[name].get("gc_young") is not None:
                    notes["young GC runs"] = f"{rows[name]['gc_young']:,.0f}"
                bare = per_s("b", f"bare aiohttp @{in_flight}")
                if name.startswith("asyncloader"):
                    spdl = per_s("b", f"spdl @{in_flight}")
                    notes["vs peer"] = (
                        f"{_fmt(_ratio(rows[name]['per_s'], bare))} of bare, "
                        f"{_fmt(_ratio(rows[name]['per_s'], spdl))}× SPDL"
                    )
                extra[name] = notes
        ours_64 = per_s("b", "asyncloader @64")
        torch_name = "torch num_workers=8"
        extra[torch_name] = {
            "of the limit": "8 in flight",
            "vs peer": f"asyncloader @64 {_fmt(_ratio(ours_64, per_s('b', torch_name)), 1)}× it",
        }
        extra["torch num_workers=2"] = {"of the limit": "2 in flight"}
        out.append(
            "### (b) 16 KiB items behind 20 ms of latency\n\n"
            "A lean HTTP/1.1 server on loopback in its own process (the demo's, "
            "`asyncloader.testing.serve_samples`). "
            "asyncloader: `HttpDataset`, batch 64, `num_workers=in-flight/4`, "
            "`item_concurrency=4`; at 64 in flight also 1×64, 2×32 and 4×16, at 256 also 16×16 "
            "(`num_workers`×`item_concurrency`: the same requests in flight, one budget for "
            "the epoch). Limit: in-flight ÷ 20 ms. bare aiohttp: one coroutine per request in "
            "flight on uvloop, the loader's loop, each body dropped at once. SPDL: an async "
            "aiohttp GET stage with the same concurrency. torch: 8 (and 2) worker processes, "
            "one keep-alive connection each.\n\n" + _table(rows, list(rows), "items/s", extra)
        )
        goals.append(("(b) asyncloader @64 ÷ limit", _ratio(ours_64, 64 / 0.020), "≥", 0.95))
        for name in rows:
            in_flight = int(name.rsplit("@", 1)[1]) if "@" in name else 0
            if name.startswith("asyncloader") and in_flight in (64, 256):
                bare = per_s("b", f"bare aiohttp @{in_flight}")
                goals.append(
                    (
                        f"(b) {name} ÷ bare aiohttp @{in_flight}",
                        _ratio(per_s("b", name), bare),
                        "≥",
                        0.95,
                    )
                )
        goals.append(
            (
                "(f) first batch, HTTP: asyncloader 4x16 @64 ÷ torch num_workers=2",
                _ratio(first("b", "asyncloader 4x16 @64"), first("b", "torch num_workers=2")),
                "≤",
                0.1,
            )
        )
    if "c" in work:
        rows = work["c"]
        single = per_s("c", "plain loop")
        extra = {}
        for name in rows:
            count = re.search(r" x(\d+)", name)
            if count is not None:
                threads = int(count.group(1))
                limit = None if single is None else min(threads, 2) * single
                extra[name] = {"of the limit": _fmt(_ratio(rows[name]["per_s"], limit))}
                if name.startswith("asyncloader"):
                    ours_t = rows[name]["per_s"]
                    extra[name]["vs peer"] = (
                        f"{_fmt(_ratio(ours_t, per_s('c', f'torch x{threads}')))}× torch, "
                        f"{_fmt(_ratio(ours_t, per_s('c', f'spdl x{threads}')))}× SPDL"
                    )
        for name in rows:
            warm = rows[name].get("warm_per_s")
            if warm is not None:
                extra.setdefault(name, {})["2nd epoch/s"] = f"{warm:,.0f}"
        processes = per_s("c", "plain loop, 2 processes")
        if processes is not None:
            extra["plain loop, 2 processes"] = {
                "of the limit": _fmt(_ratio(processes, None if single is None else 2 * single))
            }
            extra["asyncloader x2"]["vs peer"] += (
                f", {_fmt(_ratio(per_s('c', 'asyncloader x2'), processes))} of 2 processes"
            )
        out.append(
            "### (c) JPEG decode and augmentation\n\n"
            "2,000 JPEGs of 320×240: Decode → RandomResizedCrop(224) → RandomHorizontalFlip → "
            "ToFloat → Normalize → ToCHW, batch 64, the same float32 batches from every system. "
            "asyncloader, SPDL and the plain loop end the chain at uint8 and normalize while "
            "collating (`ImageCollator(mean=..., std=...)`, the settings guide's way); torch "
            "runs the whole chain per item, each item a tensor, and its default collation into "
            "shared memory (its fastest setting here; torchvision cannot be installed beside "
            'this torch wheel); "normalized per item" is asyncloader running torch\'s chain. '
            "asyncloader: `num_workers=2`, `item_concurrency=1` (each batch one job on the CPU "
            "pool). `xN`: N CPU threads (asyncloader `cpu_threads`, SPDL `num_threads` and stage "
            "concurrency) or N worker processes (torch). Limit: min(N, 2 cores) × the rate of "
            'the chain and collation in a plain loop on one core. "plain loop, 2 processes": '
            "that loop in two forked processes, half the images each: what both cores give at "
            'the time, with no GIL between them. "cpu_processes": the chain and collation in 2 '
            'worker processes; ", 2 epochs": two epochs from one loader, the images/s of the '
            "first (from a fresh process, workers started in it) and of the second.\n\n"
            + _table(rows, list(rows), "images/s", extra)
        )
        ours, theirs = work["c"].get("asyncloader x2"), work["c"].get("torch x2")
        goals.append(
            (
                "(c) asyncloader x2 ÷ limit",
                _ratio(per_s("c", "asyncloader x2"), None if single is None else 2 * single),
                "≥",
                0.85,
            )
        )
        goals.append(
            (
                "(c) asyncloader x2 ÷ torch num_workers=2",
                _ratio(per_s("c", "asyncloader x2"), per_s("c", "torch x2")),
                "≥",
                1.3,
            )
        )
        goals.append(
            (
                "(f) first batch, images: asyncloader x2 ÷ torch num_workers=2",
                _ratio(first("c", "asyncloader x2"), first("c", "torch x2")),
                "≤",
                0.1,
            )
        )
        if ours and theirs:
            goals.append(
                (
                    "(g) peak RSS of all processes, images: asyncloader x2 ÷ torch num_workers=2",
                    ours["peak_rss_mib"] / theirs["peak_rss_mib"],
                    "≤",
                    0.5,
                )
            )
            goals.append(
                (
                    "(g) the same in PSS (pages shared after fork counted once)",
                    ours["peak_pss_mib"] / theirs["peak_pss_mib"],
                    "≤",
                    0.5,
                )
            )
    if "d" in work:
        rows = work["d"]
        alone = per_s("d", "obstore alone")
        extra = {name: {"of the limit": _fmt(_ratio(rows[name]["per_s"], alone))} for name in rows}
        out.append(
            "### (d) S3 on moto, 16 KiB objects, 64 in flight\n\n"
            "moto's S3 server in its own process, 1,024 objects, each got 4 times. asyncloader: "
            "`ObjectStoreDataset`, `num_workers=16`, `item_concurrency=4`. Limit: obstore's "
            "`get_async` called directly by 64 coroutines. SPDL: an async obstore stage, "
            "concurrency 64. torch: 8 workers, obstore's blocking `get`.\n\n"
            + _table(rows, list(rows), "objects/s", extra)
        )
        goals.append(
            ("(d) asyncloader ÷ obstore alone", _ratio(per_s("d", "asyncloader"), alone), "≥", 0.95)
        )
    if "e" in work:
        rows = work["e"]
        plain = per_s("e", "plain loop")
        extra = {name: {"of the limit": _fmt(_ratio(rows[name]["per_s"], plain))} for name in rows}
        extra["asyncloader"]["vs peer"] = (
            f"{_fmt(_ratio(per_s('e', 'asyncloader'), per_s('e', 'plain loop, batches held')))}× "
            "the held loop"
        )
        out.append(
            "### (e) Large files: 64 × 4 MiB, each read 8 times, page cache warm\n\n"
            "asyncloader: `FileDataset`, batch 16; read into fresh memory (the default) with "
            "`num_workers=1`, `item_concurrency=2` (one batch at a time, its two lanes on "
            "both cores, each a job on an I/O thread that reads file after file), or "
            "mapped (`mmap=True`: each item a read-only map of the file's cached pages, "
            "populated when mapped, no copy) with `num_workers=2`, `item_concurrency=1` (each "
            "batch one job on the I/O threads). "
            "Limit: a plain read loop on one thread that drops each file at once; "
            '"batches held" keeps each batch of 16 alive until the next, as a training step '
            'does. "freed memory kept": run with glibc\'s `MALLOC_MMAP_THRESHOLD_=33554432` and '
            "`MALLOC_TRIM_THRESHOLD_=1073741824` (docs/settings.md), so that freed batches' "
            "memory is reused rather than given back and faulted in again (the loader with "
            "the same settings). "
            "SPDL: a read stage "
            "with concurrency 4; torch: 2 worker processes.\n\n"
            + _table(rows, list(rows), "MiB/s", extra)
        )
        goals.append(
            (
                "(f) first batch, files: asyncloader ÷ torch num_workers=2",
                _ratio(first("e", "asyncloader"), first("e", "torch num_workers=2")),
                "≤",
                0.1,
            )
        )
        for name in ("asyncloader", "asyncloader, mmap=True", "asyncloader, freed memory kept"):
            goals.append(
                (f"(e) {name} ÷ plain read loop", _ratio(per_s("e", name), plain), "≥", 0.9)
            )
    if "h" in work:
        rows = work["h"]
        shard_notes: dict[str, dict[str, str]] = {}
        for name in rows:
            moto = name.endswith(", moto")
            kept = ", freed memory kept" if name.endswith(", freed memory kept") else ""
            bare = per_s("h", "bare aiohttp, moto" if moto else f"bare aiohttp{kept}")
            peer = per_s("h", f"webdataset + torch num_workers=8{', moto' if moto else ''}")
            shard_notes[name] = {
                "of the bare stream": _fmt(_ratio(rows[name]["per_s"], bare)),
                "× webdataset nw=8": _fmt(_ratio(rows[name]["per_s"], peer)),
            }
        out.append(
            "### (h) WebDataset tar shards, 16 KiB samples, 1,000 a shard\n\n"
            "16 shards, each read 4 times from the sample server (20 ms before each "
            "response) and 3 times from moto's S3 server. asyncloader: `TarShards` over "
            "`HttpDataset` (or `ObjectStoreDataset`), `interleave=4`, `num_workers=4`, "
            "batch 64, samples as dicts of bytes (no decoding). Peers: the `webdataset` "
            "package in torch's `DataLoader` (curl per shard, shards split over the "
            "workers); asyncloader's `HttpDataset` with a request per sample, 64 in flight; "
            "a bare aiohttp loop that streams the shards whole, 4 at once, and parses "
            'nothing. "freed memory kept": both run with glibc\'s `MALLOC_MMAP_THRESHOLD_` and '
            "`MALLOC_TRIM_THRESHOLD_` as in (e): the bare loop otherwise reads into fresh "
            "pages in some runs and reuses freed ones in others, as glibc happens to "
            "choose, and its rate moves by up to 2.5× between runs.\n\n"
            + _table(rows, list(rows), "samples/s", shard_notes)
        )
        for moto in ("", ", moto"):
            tar = per_s("h", f"asyncloader{moto}")
            goals.append(
                (
                    f"(h) TarShards{moto} ÷ webdataset + torch num_workers=8",
                    _ratio(tar, per_s("h", f"webdataset + torch num_workers=8{moto}")),
                    "≥",
                    2.0,
                )
            )
            goals.append(
                (
                    f"(h) TarShards{moto} ÷ the bare streaming loop",
                    _ratio(tar, per_s("h", f"bare aiohttp{moto}")),
                    "≥",
                    0.9,
                )
            )
        kept_tar = per_s("h", "asyncloader, freed memory kept")
        if kept_tar is not None:
            goals.append(
                (
                    "(h) TarShards ÷ the bare streaming loop, both with freed memory kept",
                    _ratio(kept_tar, per_s("h", "bare aiohttp, freed memory kept")),
                    "≥",
                    0.9,
                )
            )
    twice = ("asyncloader cpu_processes x2, 2 epochs", "asyncloader x2, 2 epochs")
    if "c" in work and all(name in work["c"] for name in twice):
        processes, threads = (work["c"][name] for name in twice)
        goals.append(
            (
                "(c) cpu_processes=2 ÷ cpu_threads=2, first epoch of a fresh process",
                _ratio(processes["per_s"], threads["per_s"]),
                "≥",
                1.0,
            )
        )
        goals.append(
            (
                "(c) cpu_processes=2 ÷ cpu_threads=2, second epoch",
                _ratio(processes["warm_per_s"], threads["warm_per_s"]),
                "≥",
                1.0,
            )
        )
    gil_notes = {
        "i": (
            "### (i) A pure-Python transform that holds the GIL\n\n"
            "12,288 items of 16 float32, each through a Python loop of about 0.4 ms "
            "(`benches/bench_gil.py`), batch 32. asyncloader: the transform in 2 worker "
            "processes (`cpu_processes=2`), or on 2 CPU threads (`cpu_threads=2`, "
            "`num_workers=2`); torch: the same loop in its dataset, 2 persistent workers. "
            'plain loop: the transform on one core, no loader; "plain loop, 2 processes": '
            "the transform and stacking in two forked processes, half the items each, what "
            "both cores give at the time with no GIL and no loader (the ceiling of any loader "
            "here). Every run a fresh process: the first batch counts the workers' start.",
            "items/s",
            1.1,
        ),
        "j": (
            "### (j) A training step that holds the GIL, over JPEG decoding\n\n"
            "(c)'s 2,000 JPEGs and chain, batch 32; after each batch the consumer's step "
            "holds the GIL for a Python loop (about 5 ms alone) and then hashes 16 MiB "
            'with the GIL released (about 10 ms alone); "step" gives the medians each '
            "system's runs saw, on two cores shared with the loader. asyncloader: "
            "`cpu_processes=2`, or `cpu_threads=2` with `num_workers=2`; torch: 2 "
            "persistent workers (its per-item chain, as in (c)).",
            "images/s",
            1.05,
        ),
    }
    for key, (title, unit, bound) in gil_notes.items():
        if key not in work:
            continue
        rows = work[key]
        torch_rate = per_s(key, "torch num_workers=2")
        torch_warm = rows.get("torch num_workers=2", {}).get("warm_per_s")
        gil_cells: dict[str, dict[str, str]] = {}
        for name in rows:
            warm = rows[name].get("warm_per_s")
            gil_cells[name] = {
                "× torch nw=2": _fmt(_ratio(rows[name]["per_s"], torch_rate)),
                "2nd epoch/s": "" if warm is None else f"{warm:,.0f}",
                "2nd epoch × torch": _fmt(_ratio(warm, torch_warm)) if warm else "",
            }
            steps = [run for run in rows[name]["runs"] if run.get("hold_ms") is not None]
            if steps:
                hold = sorted(run["hold_ms"] for run in steps)[len(steps) // 2]
                compute = sorted(run["compute_ms"] for run in steps)[len(steps) // 2]
                gil_cells[name]["step"] = f"{hold:.1f} + {compute:.1f} ms"
        if key == "i":
            plain = per_s("i", "plain loop")
            ceiling = per_s("i", "plain loop, 2 processes")
            for name in rows:
                limit = None if plain is None else 2 * plain
                gil_cells[name]["of 2 cores"] = _fmt(_ratio(rows[name]["per_s"], limit))
                gil_cells[name]["of 2 processes"] = _fmt(_ratio(rows[name]["per_s"], ceiling))
        out.append(title + "\n\n" + _table(rows, list(rows), unit, gil_cells))
        ours = "asyncloader cpu_processes=2"
        goals.append(
            (
                f"({key}) {ours} ÷ torch num_workers=2, first epoch of a fresh process",
                _ratio(per_s(key, ours), torch_rate),
                "≥",
                bound,
            )
        )
        goals.append(
            (
                f"({key}) {ours} ÷ torch num_workers=2, second epoch",
                _ratio(rows.get(ours, {}).get("warm_per_s"), torch_warm),
                "≥",
                bound,
            )
        )
        goals.append(
            (
                f"(f) first batch, ({key}): {ours} ÷ torch num_workers=2",
                _ratio(first(key, ours), first(key, "torch num_workers=2")),
                "≤",
                0.5,
            )
        )
    out.insert(0, f"Medians of {repeats} runs per system, each a fresh process.")
    return out, goals


def goals_table(goals: list[Goal]) -> str:
    lines = ["| goal | figure | target | met |", "|---|---:|---:|:---:|"]
    for what, value, sign, bound in goals:
        if value is None:
            met = "–"
        else:
            met = "yes" if (value >= bound if sign == "≥" else value <= bound) else "**no**"
        lines.append(f"| {what} | {_fmt(value)} | {sign} {bound:g} | {met} |")
    return "\n".join(lines)


def plots(results: dict[str, Any], img: Path) -> list[str]:
    """Throughput against requests in flight and against threads, memory over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    work = results["workloads"]
    img.mkdir(parents=True, exist_ok=True)
    if "b" in work:
        figure, axes = plt.subplots(figsize=(6, 4))
        points = sorted({int(n.rsplit("@", 1)[1]) for n in work["b"] if "@" in n})
        for system in ("asyncloader", "bare aiohttp", "spdl"):
            values = [work["b"][f"{system} @{k}"]["per_s"] for k in points]
            axes.plot(points, values, marker="o", label=system)
        axes.plot(points, [k / 0.020 for k in points], "k--", label="limit (in flight ÷ 20 ms)")
        axes.set(xlabel="requests in flight", ylabel="items/s", title="16 KiB items behind 20 ms")
        axes.legend()
        figure.tight_layout()
        figure.savefig(img / "http_in_flight.png", dpi=100)
        plt.close(figure)
        made.append("![items/s against requests in flight](img/http_in_flight.png)")
    if "c" in work:
        figure, axes = plt.subplots(figsize=(6, 4))
        threads = sorted({int(n.rsplit("x", 1)[1]) for n in work["c"] if re.search(r" x\d+$", n)})
        for system in ("asyncloader", "torch", "spdl"):
            values = [work["c"][f"{system} x{t}"]["per_s"] for t in threads]
            axes.plot(threads, values, marker="o", label=system)
        single = work["c"]["plain loop"]["per_s"]
        axes.plot(threads, [min(t, 2) * single for t in threads], "k--", label="limit")
        axes.set(
            xlabel="CPU threads (torch: worker processes)",
            ylabel="images/s",
            title="JPEG decode + augment on 2 cores",
            xticks=threads,
        )
        axes.legend()
        figure.tight_layout()
        figure.savefig(img / "cpu_threads.png", dpi=100)
        plt.close(figure)
        made.append("![images/s against CPU threads](img/cpu_threads.png)")
        figure, axes = plt.subplots(figsize=(6, 4))
        for system in ("asyncloader", "torch", "spdl"):
            timeline = work["c"][f"{system} x2"]["runs"][-1]["timeline"]
            axes.plot([t for t, _ in timeline], [m for _, m in timeline], label=system)
        axes.set(
            xlabel="seconds since the process started",
            ylabel="RSS of all processes, MiB",
            title="Memory over a run: images, 2 threads / workers",
        )
        axes.legend()
        figure.tight_layout()
        figure.savefig(img / "memory_over_time.png", dpi=100)
        plt.close(figure)
        made.append("![RSS of all processes over a run](img/memory_over_time.png)")
    return made


def write_report(results: dict[str, Any], markdown: Path, docs: Path) -> None:
    """``benches/results/suite.md``, the plots, and the generated part of performance.md."""
    parts, goals = sections(results)
    images = plots(results, docs / "img")
    text = (
        "## The suite: goals\n\n"
        + goals_table(goals)
        + "\n\n## The suite: workloads\n\n"
        + "\n\n".join(parts)
        + "\n\n"
        + "\n\n".join(images)
        + "\n"
    )
    markdown.write_text(text.replace("](img/", "](../../docs/img/"))
    performance = docs / "performance.md"
    current = performance.read_text()
    block = f"{MARK_START}\n\n{text}\n{MARK_END}"
    pattern = re.compile(re.escape(MARK_START) + ".*?" + re.escape(MARK_END), re.S)
    if pattern.search(current):
        performance.write_text(pattern.sub(lambda _: block, current))
    else:
        performance.write_text(current.rstrip() + "\n\n" + block + "\n")
