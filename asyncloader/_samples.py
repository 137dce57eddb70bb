"""The sample server: synthetic samples over HTTP/1.1 on 127.0.0.1, in a process of its own.

A bare protocol with a fixed latency per request, like a nearby object store; the demo, the
benchmark suite and the tests read from it (:func:`asyncloader.testing.serve_samples`).
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar, cast

import numpy as np

SAMPLE_FLOATS = 1024
"""Each sample is 1,024 float32 values (4 KiB)."""


def sample(index: int, floats: int = SAMPLE_FLOATS) -> bytes:
    """The bytes the server sends for sample ``index``: ``floats`` copies of ``index``."""
    return np.full(floats, index, dtype=np.float32).tobytes()


SHARD_SAMPLES = 1000
"""Samples in each shard the server sends."""


def shard(number: int, floats: int = SAMPLE_FLOATS, samples: int = SHARD_SAMPLES) -> bytes:
    """Shard ``number`` as the server sends it: a WebDataset tar whose sample
    ``{number:06d}{i:04d}`` has one member, ``.bin``: :func:`sample` of its place in all
    the shards."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for i in range(samples):
            data = sample(number * samples + i, floats)
            info = tarfile.TarInfo(f"{number:06d}{i:04d}.bin")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


class _SampleServer(asyncio.Protocol):
    """One connection of the sample server: HTTP/1.1 GETs, answered after the latency.

    A bare protocol, not aiohttp's web server, which costs about 0.2 ms of CPU per request on
    the loader's cores: this one parses only the request line, so the loader, not the server,
    is what the demo and the benchmark suite measure.
    """

    in_flight = 0
    peak = 0

    shards: ClassVar[dict[int, bytes]] = {}
    """The shards served, made when the server starts."""

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
            name = path.rsplit(b"/", 1)[1]
            if path.startswith(b"/shards/"):
                number = int(name.removesuffix(b".tar"))
                loop.call_later(self.latency_s, self.respond, _SampleServer.shards.get(number))
            else:
                loop.call_later(self.latency_s, self.respond, sample(int(name), self.floats))

    def respond(self, payload: bytes | None) -> None:
        _SampleServer.in_flight -= 1
        if payload is None:
            self.send(b"no such shard", status="404 Not Found")
        else:
            self.send(payload)

    def send(self, payload: bytes, status: str = "200 OK") -> None:
        if self.transport is not None and not self.transport.is_closing():
            header = f"HTTP/1.1 {status}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            self.transport.write(header)
            self.transport.write(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def serve_forever(latency_s: float, floats: int = SAMPLE_FLOATS, shards: int = 0) -> None:
    """The server process: on 127.0.0.1 (uvloop when installed), it answers
    ``GET /samples/{index}`` with :func:`sample` and ``GET /shards/{number}.tar`` with
    :func:`shard` (for ``number`` below ``shards``) after ``latency_s``, and ``GET /stats``
    with the most requests it has had in flight; prints its port, serves until terminated."""
    _SampleServer.shards = {number: shard(number, floats) for number in range(shards)}

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
def serve_samples(latency_s: float, floats: int = SAMPLE_FLOATS, shards: int = 0) -> Iterator[str]:
    """Run a sample server in a process of its own (so it takes no CPU from the loader's
    interpreter, as a real remote server would not); yield its base URL. With ``shards``, it
    also serves that many WebDataset shards of :data:`SHARD_SAMPLES` samples each."""
    code = (
        "from asyncloader._samples import serve_forever; "
        f"serve_forever({latency_s!r}, {floats}, {shards})"
    )
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
