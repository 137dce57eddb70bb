"""Real servers on 127.0.0.1 for the tests: an aiohttp server with fault injection, and moto.

Each runs on a thread of its own with its own event loop, so tests may drive datasets from the
loader's loop (``for``) or from pytest's loop (``async for``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web


def body(size: int) -> bytes:
    """The deterministic body of ``/ok/{size}``."""
    return bytes(i % 251 for i in range(size))


class FaultServer:
    """Routes that fail in each way a real server or network can, counting every hit."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.headers_seen: list[dict[str, str]] = []
        self.url = ""

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
        return app

    def _hit(self, request: web.Request) -> None:
        self.hits[request.path] += 1
        self.headers_seen.append(dict(request.headers))

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


@contextmanager
def run_moto(bucket: str, objects: dict[str, bytes]) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with ``bucket`` holding ``objects``; yields its endpoint."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)
    for key, value in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=value)
    try:
        yield endpoint
    finally:
        client.close()
        server.stop()
