"""Real servers on 127.0.0.1 for the tests: an aiohttp server with fault injection, and moto.

Each runs on a thread of its own with its own event loop, so tests may drive datasets from the
loader's loop (``for``) or from pytest's loop (``async for``).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import random
import re
import struct
import threading
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web


def body(size: int) -> bytes:
    """The deterministic body of ``/ok/{size}``."""
    return bytes(i % 251 for i in range(size))


def random_body(index: int) -> bytes:
    """The body of ``/random/{index}``: 2 KiB that differ for every index."""
    return hashlib.sha256(str(index).encode()).digest() * 64


FAULTS = ("500", "503", "reset", "short", "stall")


def _range(request: web.Request, data: bytes, headers: dict[str, str]) -> web.Response:
    """``data`` with ``headers``: the range ``Range: bytes=a-b`` (or ``a-``) asks for, as a
    206, or whole."""
    asked = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", ""))
    if asked is None:
        return web.Response(body=data, headers=headers)
    first, last = int(asked.group(1)), min(int(asked.group(2) or len(data)), len(data) - 1)
    return web.Response(
        status=206,
        body=data[first : last + 1],
        headers={"Content-Range": f"bytes {first}-{last}/{len(data)}", **headers},
    )


class FaultServer:
    """Routes that fail in each way a real server or network can, counting every hit."""

    def __init__(self, seed: int = 0) -> None:
        self.hits: Counter[str] = Counter()
        self.headers_seen: list[dict[str, str]] = []
        self.accepted: list[list[str]] = []
        self.connections: set[tuple[str, int]] = set()
        """The clients' (host, port) of every request: one for each connection."""
        """Each ``Accept-Encoding`` an ``/encoded`` request sent (all, if several)."""
        self.url = ""
        self.rng = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.streak: Counter[str] = Counter()
        self.stall_s = 1.0
        self.sent: Counter[str] = Counter()
        """Bytes ``/files-endless/{name}`` sent past its file."""
        self.files: dict[str, bytes] = {}
        """What ``/files/{name}`` serves (``/files-cut/{name}``: its first half, then a close)."""

    def routes(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ok/{size}", self.ok)
        app.router.add_get("/status/{code}/{key}", self.status)
        app.router.add_get("/flaky/{code}/{fails}/{key}", self.flaky)
        app.router.add_get("/retry-after/{seconds}/{key}", self.retry_after)
        app.router.add_get("/reset/{key}", self.reset)
        app.router.add_get("/short/{key}", self.short)
        app.router.add_get("/slow/{key}", self.slow)
        app.router.add_get("/slow-body/{key}", self.slow_body)
        app.router.add_get("/chunked/{size}/{key}", self.chunked)
        app.router.add_get("/liar/{key}", self.liar)
        app.router.add_get("/redirect/{key}", self.redirect)
        app.router.add_get("/echo/{name}", self.echo)
        app.router.add_get("/random/{index}", self.random_faults)
        app.router.add_get("/bomb", self.bomb)
        app.router.add_get("/files/{name}", self.file)
        app.router.add_get("/files-cut/{name}", self.file_cut)
        app.router.add_get("/cut/{cuts}/{name}", self.cut)
        app.router.add_get("/ranged/{name}", self.ranged)
        app.router.add_get("/wrong-range/{name}", self.wrong_range)
        app.router.add_get("/encoded/{name}", self.encoded)
        app.router.add_get("/replaced/{etags}/{after}/{name}", self.replaced)
        app.router.add_get("/flaky-files/{fails}/{name}", self.flaky_file)
        app.router.add_get("/files-stall/{name}", self.file_stall)
        app.router.add_get("/files-endless/{name}", self.file_endless)
        return app

    def _hit(self, request: web.Request) -> None:
        self.hits[request.path] += 1
        self.headers_seen.append(dict(request.headers))
        if request.transport is not None:
            self.connections.add(request.transport.get_extra_info("peername"))

    async def ok(self, request: web.Request) -> web.Response:
        self._hit(request)
        return web.Response(body=body(int(request.match_info["size"])))

    async def status(self, request: web.Request) -> web.Response:
        self._hit(request)
        return web.Response(status=int(request.match_info["code"]), text="no")

    async def flaky(self, request: web.Request) -> web.Response:
        self._hit(request)
        if self.hits[request.path] <= int(request.match_info["fails"]):
            return web.Response(status=int(request.match_info["code"]))
        return web.Response(body=b"recovered")

    async def retry_after(self, request: web.Request) -> web.Response:
        self._hit(request)
        if self.hits[request.path] == 1:
            return web.Response(status=503, headers={"Retry-After": request.match_info["seconds"]})
        return web.Response(body=b"after")

    async def reset(self, request: web.Request) -> web.StreamResponse:
        self._hit(request)
        response = web.StreamResponse(headers={"Content-Length": "100000"})
        await response.prepare(request)
        await response.write(b"x" * 1000)
        assert request.transport is not None
        request.transport.abort()  # a reset in the middle of the body
        return response

    async def short(self, request: web.Request) -> web.StreamResponse:
        self._hit(request)
        response = web.StreamResponse(headers={"Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b"y" * 400)
        assert request.transport is not None
        request.transport.close()  # a clean close before Content-Length bytes
        return response

    async def slow(self, request: web.Request) -> web.Response:
        self._hit(request)
        await asyncio.sleep(5)
        return web.Response(body=b"late")

    async def slow_body(self, request: web.Request) -> web.StreamResponse:
        self._hit(request)
        response = web.StreamResponse(headers={"Content-Length": "2000"})
        await response.prepare(request)
        await response.write(b"s" * 1000)  # headers and half the body at once, then a stall
        await asyncio.sleep(5)
        await response.write(b"s" * 1000)
        return response

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        self._hit(request)
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        remaining = int(request.match_info["size"])
        while remaining:
            step = min(remaining, 4096)
            await response.write(b"z" * step)
            remaining -= step
        await response.write_eof()
        return response

    async def liar(self, request: web.Request) -> web.Response:
        self._hit(request)
        return web.Response(body=b"w" * 10, headers={"Content-Length": "10"}, status=200)

    async def redirect(self, request: web.Request) -> web.Response:
        self._hit(request)
        raise web.HTTPFound(request.path)  # to itself, forever

    async def random_faults(self, request: web.Request) -> web.StreamResponse:
        """Fails 30 % of requests at random, never more than 3 times in a row for one path."""
        self._hit(request)
        path = request.path
        payload = random_body(int(request.match_info["index"]))
        if self.streak[path] >= 3 or self.rng.random() >= 0.3:
            self.streak[path] = 0
            return web.Response(body=payload)
        self.streak[path] += 1
        fault = self.rng.choice(FAULTS)
        self.faults[fault] += 1
        if fault == "500":
            return web.Response(status=500)
        if fault == "503":
            return web.Response(status=503, headers={"Retry-After": "0"})
        if fault == "stall":
            await asyncio.sleep(self.stall_s)
            return web.Response(body=payload)
        response = web.StreamResponse(headers={"Content-Length": str(len(payload))})
        await response.prepare(request)
        await response.write(payload[: len(payload) // 3])
        assert request.transport is not None
        if fault == "reset":
            request.transport.abort()
        else:
            request.transport.close()
        return response

    async def bomb(self, request: web.Request) -> web.Response:
        """A PNG whose header claims 100,000 x 100,000 pixels: a decompression bomb."""
        self._hit(request)

        def chunk(kind: bytes, body: bytes) -> bytes:
            crc = struct.pack(">I", zlib.crc32(kind + body))
            return struct.pack(">I", len(body)) + kind + body + crc

        header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")
        return web.Response(body=png, content_type="image/png")

    async def file(self, request: web.Request) -> web.Response:
        self._hit(request)
        data = self.files.get(request.match_info["name"])
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data)

    async def ranged(self, request: web.Request) -> web.Response:
        """``/files/{name}`` that answers ``Range: bytes=a-b`` with 206 and that range."""
        self._hit(request)
        return _range(request, self.files[request.match_info["name"]], {})

    async def replaced(self, request: web.Request) -> web.Response:
        """``/ranged/{name}``, but from its ``after + 1``-st request on the file is
        ``{name}.next``, as if it were overwritten while a reader read it. ``etags``: ``strong``
        (an ETag for each version, ``If-Match`` honoured with 412, as S3 does), ``ignored`` (an
        ETag each, ``If-Match`` ignored), ``none`` (neither)."""
        self._hit(request)
        etags, name = request.match_info["etags"], request.match_info["name"]
        version = 2 if self.hits[request.path] > int(request.match_info["after"]) else 1
        data = self.files[name if version == 1 else f"{name}.next"]
        tag = {"ETag": f'"v{version}"'} if etags != "none" else {}
        wanted = request.headers.get("If-Match")
        if etags == "strong" and wanted is not None and wanted != tag["ETag"]:
            return web.Response(status=412)
        return _range(request, data, tag)

    async def _half_file(self, request: web.Request) -> tuple[web.StreamResponse, bytes]:
        """The whole file's Content-Length, and its first half sent."""
        self._hit(request)
        data = self.files[request.match_info["name"]]
        response = web.StreamResponse(headers={"Content-Length": str(len(data))})
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        return response, data

    async def file_stall(self, request: web.Request) -> web.StreamResponse:
        """``/files/{name}``'s first half, then silence for 5 s before the rest."""
        response, data = await self._half_file(request)
        await asyncio.sleep(5)
        await response.write(data[len(data) // 2 :])
        return response

    async def file_endless(self, request: web.Request) -> web.StreamResponse:
        """``/files/{name}``, then bytes without end (chunked), counted in :attr:`sent`
        until the client goes."""
        self._hit(request)
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(self.files[request.match_info["name"]])
        while True:
            await response.write(b"\xff" * 65536)
            self.sent[request.path] += 65536

    async def flaky_file(self, request: web.Request) -> web.Response:
        """``/files/{name}`` after ``fails`` answers of 503 (Retry-After: 0)."""
        self._hit(request)
        if self.hits[request.path] <= int(request.match_info["fails"]):
            return web.Response(status=503, headers={"Retry-After": "0"})
        return web.Response(body=self.files[request.match_info["name"]])

    async def encoded(self, request: web.Request) -> web.Response:
        """``/ranged/{name}`` of the file stored gzipped with ``Content-Encoding: gzip`` (as S3
        keeps an object uploaded so): a range is of the stored bytes, whatever the client
        accepts."""
        self._hit(request)
        self.accepted.append(request.headers.getall("Accept-Encoding", []))
        stored = gzip.compress(self.files[request.match_info["name"]], mtime=0)
        return _range(request, stored, {"Content-Encoding": "gzip"})

    async def wrong_range(self, request: web.Request) -> web.Response:
        """206 with the first bytes of the file, whatever range was asked for."""
        self._hit(request)
        data = self.files[request.match_info["name"]]
        return web.Response(
            status=206, body=data[:100], headers={"Content-Range": f"bytes 0-99/{len(data)}"}
        )

    async def file_cut(self, request: web.Request) -> web.StreamResponse:
        response, _ = await self._half_file(request)
        assert request.transport is not None
        request.transport.close()  # the connection ends in the middle of the shard
        return response

    async def cut(self, request: web.Request) -> web.StreamResponse:
        """``/ranged/{name}`` with a strong ETag and ``If-Match`` honoured, whose first
        ``cuts`` answers end a quarter of the way through their body, the connection closed
        there."""
        self._hit(request)
        tag = '"v1"'
        if request.headers.get("If-Match", tag) != tag:
            return web.Response(status=412)
        answer = _range(request, self.files[request.match_info["name"]], {"ETag": tag})
        if self.hits[request.path] > int(request.match_info["cuts"]):
            return answer
        body = answer.body
        assert isinstance(body, bytes)
        headers = {**answer.headers, "Content-Length": str(len(body))}
        response = web.StreamResponse(status=answer.status, headers=headers)
        await response.prepare(request)
        await response.write(body[: len(body) // 4])
        assert request.transport is not None
        request.transport.close()
        return response

    async def echo(self, request: web.Request) -> web.Response:
        self._hit(request)
        return web.Response(text=request.match_info["name"])


@contextmanager
def run_fault_server() -> Iterator[FaultServer]:
    """Start a :class:`FaultServer` on 127.0.0.1 in a thread; stop it on exit."""
    server = FaultServer()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(
        server.routes(), access_log=None, shutdown_timeout=1.0, handler_cancellation=True
    )
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    thread = threading.Thread(target=loop.run_forever, name="fault-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


class Moto:
    """A running moto S3 server on 127.0.0.1 that can be restarted on its port."""

    def __init__(self) -> None:
        self.client: Any = None
        """A boto3 S3 client of the server, in :func:`run_moto`."""
        self.server = self._make(0)
        self.server.start()
        host, self.port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{self.port}"

    @staticmethod
    def _make(port: int) -> Any:
        from moto.server import ThreadedMotoServer

        return ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)

    def restart(self) -> None:
        """Stop the server and start another on the same port (moto keeps its data)."""
        self.server.stop()
        self.server = self._make(self.port)
        self.server.start()


@contextmanager
def run_moto(bucket: str, objects: dict[str, bytes]) -> Iterator[Moto]:
    """moto's S3 server with ``bucket`` holding ``objects``."""
    import boto3

    moto = Moto()
    client = boto3.client(
        "s3",
        endpoint_url=moto.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    moto.client = client
    client.create_bucket(Bucket=bucket)
    for key, value in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=value)
    try:
        yield moto
    finally:
        client.close()
        moto.server.stop()
