"""The command line: ``asyncloader bench SOURCE`` and ``asyncloader demo``.

``bench`` answers "how fast can I read this?" in one command: it streams a source for a number
of seconds or items with a progress bar, then prints items/s, MB/s, latency percentiles, the
statistics report and the options of the next run to try. A source is an HTTP URL template with
``{index}``, an object-store prefix (``s3://``, ``gs://``, ``az://``, ``file://``,
``memory://``) or a local folder; with ``--tar`` its items are WebDataset tar shards (a shard
list by template, prefix or folder), and their samples are read (``TarShards``); with
``--parquet`` they are Parquet files, and their rows are read (``ParquetShards``, ``--columns``
to pick some). A bad source, missing credentials or an empty prefix exit with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from ._loader import DataLoader
from ._stats import LoaderStats
from .datasets import (
    FileDataset,
    HttpDataset,
    ObjectStoreDataset,
    ParquetShards,
    Retry,
    TarShards,
    Template,
)
from .datasets._objectstore import SCHEMES

_S3_CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


class UsageError(Exception):
    """A bad source or option: reported in one line, exit status 2."""


def _store_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.endpoint:
        options["endpoint"] = args.endpoint
    if args.region:
        options["region"] = args.region
    if args.allow_http:
        options["allow_http"] = True
    if args.anonymous:
        options["skip_signature"] = True
    return options


def _check_s3_credentials(source: str, options: dict[str, Any]) -> None:
    # Checked here, not by trying: without credentials the client would ask the cloud's
    # instance metadata service, which only answers on a cloud machine.
    if not source.startswith(("s3://", "s3a://")) or options.get("skip_signature"):
        return
    if any(os.environ.get(name) for name in _S3_CREDENTIALS):
        return
    raise UsageError(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
        "or pass --anonymous for a public bucket"
    )


def open_source(args: argparse.Namespace) -> Any:
    """The dataset that ``args.source`` names.

    Raises:
        UsageError: The source is of no known kind, or cannot be opened.
    """
    source: str = args.source
    retry = Retry(max_retries=args.retries)
    if source.startswith(("http://", "https://")):
        if "{index" not in source:
            raise UsageError("an HTTP source is a URL template with {index}, and --items N")
        if args.items is None:
            raise UsageError("an HTTP source needs --items N (how many indices exist)")
        try:
            return HttpDataset(Template(source), length=args.items, retry=retry)
        except ValueError as error:
            raise UsageError(str(error)) from None
    if source.startswith(SCHEMES) and not source.startswith(("http://", "https://")):
        options = _store_options(args)
        _check_s3_credentials(source, options)
        try:
            return asyncio.run(ObjectStoreDataset.from_prefix(source, retry=retry, **options))
        except (ValueError, OSError) as error:
            raise UsageError(str(error)) from None
    if "://" in source:
        raise UsageError(f"{source.split('://')[0]}:// is not a supported source")
    if not os.path.isdir(source):
        raise UsageError(f"{source!r} is not a folder, an HTTP URL template or a store prefix")
    paths = sorted(
        os.path.relpath(os.path.join(folder, name), source)
        for folder, _, names in os.walk(source)
        for name in names
    )
    if not paths:
        raise UsageError(f"the folder {source!r} has no file")
    return FileDataset(paths, root=source, retry=retry, mmap=args.mmap)


def _shards(args: argparse.Namespace, dataset: Any) -> Any:
    """The stream of samples (``--tar``) or rows (``--parquet``) of the shards ``dataset``
    locates."""
    if args.parquet:
        columns = None if args.columns is None else [c for c in args.columns.split(",") if c]
        return ParquetShards(dataset, columns=columns, interleave=args.interleave)
    return TarShards(dataset, interleave=args.interleave)


def bench(args: argparse.Namespace) -> int:
    """Stream the source; print the figures, the report and the setting to change."""
    from tqdm import tqdm

    if args.columns is not None and not args.parquet:
        raise UsageError("--columns picks the columns of Parquet shards: it needs --parquet")
    dataset = open_source(args)
    total: int | None = len(dataset)
    shards = args.tar or args.parquet
    if shards:  # the source's items are shards: a stream of their samples or rows
        dataset, total = _shards(args, dataset), None
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        collate_fn=list,
        num_workers=args.num_workers,
        item_concurrency=1 if shards else args.item_concurrency,
        errors="skip",
    )
    limit_items = args.items if args.items is not None and not shards else total
    deadline = time.perf_counter() + args.seconds
    items = 0
    started = time.perf_counter()
    unit = "row" if args.parquet else "sample" if args.tar else "item"
    with loader, tqdm(total=limit_items, unit=unit, disable=args.no_progress) as bar:
        for batch in loader:
            items += len(batch)
            bar.update(len(batch))
            if (limit_items is not None and items >= limit_items) or (
                time.perf_counter() >= deadline
            ):
                break
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    print(
        f"{items} {unit}s in {elapsed:.2f} s: {items / elapsed:,.0f} {unit}s/s, "
        f"{stats.bytes / elapsed / 1e6:,.1f} MB/s; fetch latency p50 "
        f"{stats.fetch.p50_s * 1000:.1f} ms, p99 {stats.fetch.p99_s * 1000:.1f} ms"
    )
    print(stats.report())
    print(f"suggested: {suggestion(args, stats)}")
    if stats.skipped:
        print(f"{stats.skipped} items failed and were skipped (see the log)")
    return 0


def suggestion(args: argparse.Namespace, stats: LoaderStats) -> str:
    """The next run to try, as this command's options: what the report's bottleneck line
    advises, for a command whose consumer does nothing."""
    stage = stats.bottleneck()[0]
    if stage == "idle":
        return "none: no batch came"
    if stage != "fetch":  # a loop that only counts cannot be slower than the source
        return f"none: the loader kept ahead of this loop ({stage}-bound)"
    if (args.tar or args.parquet) and 0 < stats.shards <= args.interleave:
        return (
            f"none of the loader's settings: all {stats.shards} shards were read at once "
            f"(--interleave {args.interleave})"
        )
    if args.tar or args.parquet:
        return f"--interleave {2 * args.interleave} (twice the shards read at once)"
    limit, peak = stats.requests_limit, stats.peak_in_flight
    if peak < limit:
        return (
            f"none of the loader's settings: {peak} of its {limit} requests were in flight at "
            "most, so more would not be used (in a short run: a longer one, --seconds/--items)"
        )
    return (
        f"--item-concurrency {2 * args.item_concurrency} ({2 * limit} requests in flight, "
        f"{limit} now)"
    )


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:  # nan too: a deadline it never reaches
        raise argparse.ArgumentTypeError(f"must be above 0 (inf: no limit), got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncloader", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bench_parser = commands.add_parser("bench", help="how fast can I read this source?")
    bench_parser.add_argument("source", help="HTTP URL template, store prefix or folder")
    bench_parser.add_argument("--seconds", type=_seconds, default=10.0, help="stop after (10)")
    bench_parser.add_argument("--items", type=_count, help="stop after, and HTTP's item count")
    bench_parser.add_argument("--batch-size", type=int, default=64)
    # 16 batches of 4 lanes: 64 requests in flight, the settings guide's choice for throughput.
    bench_parser.add_argument("--num-workers", type=int, default=16)
    bench_parser.add_argument("--item-concurrency", type=int, default=4)
    bench_parser.add_argument("--mmap", action="store_true", help="map a folder's files")
    shards = bench_parser.add_mutually_exclusive_group()
    shards.add_argument(
        "--tar", action="store_true", help="the items are WebDataset tar shards: read samples"
    )
    shards.add_argument(
        "--parquet", action="store_true", help="the items are Parquet files: read rows"
    )
    bench_parser.add_argument("--columns", help="with --parquet: the columns read (a,b,...)")
    bench_parser.add_argument("--interleave", type=int, default=4, help="shards at once (4)")
    bench_parser.add_argument("--retries", type=int, default=3)
    bench_parser.add_argument("--endpoint", help="object store endpoint URL")
    bench_parser.add_argument("--region", help="object store region")
    bench_parser.add_argument("--allow-http", action="store_true", help="plain-HTTP endpoint")
    bench_parser.add_argument("--anonymous", action="store_true", help="unsigned requests")
    bench_parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    commands.add_parser("demo", help="stream from a local server it starts (demo --help)")
    return parser


def run() -> NoReturn:
    """The ``asyncloader`` command: :func:`main`, then an exit that skips finalization.

    Everything is closed by then; the interpreter's finalization is skipped because obstore's
    runtime threads can abort a process whose interpreter is being torn down (seen on Python
    3.10 after a failed listing, with no Python frame left).
    """
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `asyncloader bench ... | head`: the reader has gone
        code = 1
    logging.shutdown()
    with contextlib.suppress(BrokenPipeError):
        sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; return its exit status (2 for a usage error)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["demo"]:  # the demo parses its own options
        from ._demo import main as demo

        return demo(arguments[1:])
    args = _parser().parse_args(arguments)
    try:
        return bench(args)
    except (UsageError, ValueError) as error:  # ValueError: a setting refused by the loader
        print(f"asyncloader bench: {error}", file=sys.stderr)
        return 2
    finally:
        # Free what failed tasks left in reference cycles (an object store's client) while
        # the interpreter is whole: freed during its exit, it could abort the process.
        gc.collect()
