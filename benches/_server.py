"""A lean HTTP/1.1 sample server for the latency workloads, in a process of its own.

The workload's limit is requests in flight / latency, so the server must not be what limits a
run: aiohttp's web server costs about 0.2 ms of CPU per request, which on two cores (shared
with the client) caps a run near 0.8 of the limit at 64 in flight. This one is a bare
``asyncio.Protocol`` on uvloop: it parses only the request line, answers every GET for
``/samples/{index}`` after ``latency_s`` with ``size`` bytes that hold the index, and keeps the
connection alive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import numpy as np

from asyncloader._demo import serve_in_process


def body(index: int, size: int) -> bytes:
    """The bytes served for sample ``index``: float32 copies of ``index``."""
    return np.full(size // 4, index, dtype=np.float32).tobytes()


class _Samples(asyncio.Protocol):
    def __init__(self, latency_s: float, size: int) -> None:
        self.latency_s = latency_s
        self.size = size
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
            index = int(path.rsplit(b"/", 1)[1])
            loop.call_later(self.latency_s, self.respond, index)

    def respond(self, index: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        payload = body(index, self.size)
        header = f"HTTP/1.1 200 OK\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        self.transport.write(header + payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def serve_forever(latency_s: float, size: int) -> None:
    """The server process: prints its port, serves until terminated."""
    import uvloop

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Samples(latency_s, size), "127.0.0.1", 0, backlog=4096
        )
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    uvloop.run(serve())


@contextmanager
def lean_server(latency_s: float, size: int) -> Iterator[str]:
    """Run the server in a process of its own; yield its base URL."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"from _server import serve_forever; serve_forever({latency_s!r}, {size})"
    )
    with serve_in_process(code) as url:
        yield url
