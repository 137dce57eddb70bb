"""``python -m asyncloader demo``: stream an epoch from a local HTTP server it starts itself.

The server (a bare HTTP/1.1 protocol on 127.0.0.1, in a process of its own) serves synthetic
samples with a few milliseconds of latency, like a nearby object store; the loader keeps many
requests in flight on one event loop, decodes each sample on the CPU pool and collates batches
in order. The benchmark suite serves its HTTP workload from the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import numpy as np

from ._loader import DataLoader
from .datasets import HttpDataset, Template

SAMPLE_FLOATS = 1024
"""Each sample is 1,024 float32 values (4 KiB)."""


def sample(index: int, floats: int = SAMPLE_FLOATS) -> bytes:
    """The bytes the server sends for sample ``index``: ``floats`` copies of ``index``."""
    return np.full(floats, index, dtype=np.float32).tobytes()


class _SampleServer(asyncio.Protocol):
    """One connection of the sample server: HTTP/1.1 GETs, answered after the latency.

    A bare protocol, not aiohttp's web server: that one costs about 0.2 ms of CPU per
    request, which on a 2-core machine (shared with the loader) capped the demo at about 65% of
    its limit at 64 in flight; this one parses only the request line, so the loader, not the
    server, is what the demo and the benchmark suite measure.
    """

    in_flight = 0
    peak = 0

    def __init__(self, latency_s: float, floats: int) -> None:
        self.latency_s = latency_s
        self.floats = floats
        self.pending = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.pending += data
        loop = asyncio.get_running_loop()
        while b"\r\n\r\n" in self.pending:
            head, self.pending = self.pending.split(b"\r\n\r\n", 1)
            path = head.split(b" ", 2)[1]
            if path == b"/stats":
                self.send(json.dumps({"peak_in_flight": _SampleServer.peak}).encode())
                continue
            _SampleServer.in_flight += 1
            _SampleServer.peak = max(_SampleServer.peak, _SampleServer.in_flight)
            loop.call_later(self.latency_s, self.respond, int(path.rsplit(b"/", 1)[1]))

    def respond(self, index: int) -> None:
        _SampleServer.in_flight -= 1
        self.send(sample(index, self.floats))

    def send(self, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            header = f"HTTP/1.1 200 OK\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            self.transport.write(header + payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def serve_forever(latency_s: float, floats: int = SAMPLE_FLOATS) -> None:
    """The server process: on 127.0.0.1 (uvloop when installed), it answers
    ``GET /samples/{index}`` with :func:`sample` after ``latency_s`` and ``GET /stats`` with
    the most requests it has had in flight; prints its port, serves until terminated."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _SampleServer(latency_s, floats), "127.0.0.1", 0, backlog=4096
        )
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()  # until the parent terminates this process

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is the [fast] extra
        asyncio.run(serve())
    else:
        uvloop.run(serve())


@contextmanager
def serve_samples(latency_s: float, floats: int = SAMPLE_FLOATS) -> Iterator[str]:
    """Run a sample server in a process of its own (so it takes no CPU from the loader's
    interpreter, as a real remote server would not); yield its base URL."""
    code = f"from asyncloader._demo import serve_forever; serve_forever({latency_s!r}, {floats})"
    with serve_in_process(code) as url:
        yield url


@contextmanager
def serve_in_process(code: str) -> Iterator[str]:
    """Run ``python -c code``, a server that prints its port first; yield its base URL."""
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError("the sample server did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()


def peak_in_flight(url: str) -> int:
    """The most requests the sample server at ``url`` has had in flight at once."""
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as response:
        peak: int = json.load(response)["peak_in_flight"]
    return peak


def decode(index: int, item: bytes) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The demo's transform: bytes to a float32 vector."""
    return np.frombuffer(item, dtype=np.float32)


def run_demo(items: int, batch_size: int, in_flight: int, latency_s: float) -> dict[str, float]:
    """Stream one epoch of ``items`` samples; print and return what was measured."""
    from tqdm import tqdm

    # Batches of 4 lanes, as many as make up the requests in flight: the settings guide's
    # choice for throughput (docs/settings.md).
    item_concurrency = max(1, min(4, in_flight))
    num_workers = max(1, in_flight // item_concurrency)
    with serve_samples(latency_s) as url:
        dataset = HttpDataset(Template(url + "/samples/{index}"), length=items)
        with DataLoader(
            dataset,
            batch_size=batch_size,
            transform=decode,
            num_workers=num_workers,
            item_concurrency=item_concurrency,
        ) as loader:
            start = time.perf_counter()
            seen = 0
            for batch in tqdm(loader, unit="batch", desc="epoch 0"):
                # Each row holds its own index: a wrong order or a lost sample shows here.
                expected = np.arange(seen, seen + len(batch), dtype=np.float32)
                if not np.array_equal(batch[:, 0], expected):
                    raise AssertionError(f"batch out of order at sample {seen}")
                seen += len(batch)
            elapsed = time.perf_counter() - start
        peak = peak_in_flight(url)
    limit = num_workers * item_concurrency / latency_s
    figures = {
        "items": float(seen),
        "items_per_s": seen / elapsed,
        "batches_per_s": len(loader) / elapsed,
        "peak_in_flight": float(peak),
        "limit_items_per_s": limit,
    }
    print(
        f"\n{seen} items in {elapsed:.2f} s: {figures['items_per_s']:,.0f} items/s, "
        f"{figures['batches_per_s']:,.1f} batches/s, "
        f"{peak} requests in flight at peak "
        f"(limit {num_workers * item_concurrency} / {latency_s * 1000:.0f} ms "
        f"= {limit:,.0f} items/s; {figures['items_per_s'] / limit:.0%} of it)"
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    """Parse the demo's options and run it."""
    parser = argparse.ArgumentParser(prog="asyncloader demo", description=__doc__)
    parser.add_argument("--items", type=int, default=20_000, help="samples in the epoch")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=64, help="requests in flight")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="server latency")
    args = parser.parse_args(argv)
    run_demo(args.items, args.batch_size, args.in_flight, args.latency_ms / 1000)
    return 0
