"""The sample server: synthetic samples over HTTP/1.1 on 127.0.0.1, in a process of its own.

A bare protocol with a fixed latency per request, like a nearby object store; the demo, the
benchmark suite and the tests read from it (:func:`asyncloader.testing.serve_samples`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import numpy as np

SAMPLE_FLOATS = 1024
"""Each sample is 1,024 float32 values (4 KiB)."""


def sample(index: int, floats: int = SAMPLE_FLOATS) -> bytes:
    """The bytes the server sends for sample ``index``: ``floats`` copies of ``index``."""
    return np.full(floats, index, dtype=np.float32).tobytes()


class _SampleServer(asyncio.Protocol):
    """One connection of the sample server: HTTP/1.1 GETs, answered after the latency.

    A bare protocol, not aiohttp's web server, which costs about 0.2 ms of CPU per request on
    the loader's cores: this one parses only the request line, so the loader, not the server,
    is what the demo and the benchmark suite measure.
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
    code = f"from asyncloader._samples import serve_forever; serve_forever({latency_s!r}, {floats})"
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
