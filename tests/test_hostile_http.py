"""HttpDataset against servers that misbehave on purpose (raw sockets on 127.0.0.1).

Redirects of every kind, credential headers and origins, malformed heads, lengths and
encodings, bombs under each ``Content-Encoding``, bodies that trickle, and the sessions and
sockets left behind by many event loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from asyncloader import DataLoader, HttpDataset, Retry

from .datasets import first_item, streamed
from .raw_server import RawServer, deflate_bomb, gzip_bomb, response, run_raw_server
from .servers import FaultServer

ROOT = Path(__file__).parent.parent
SECRETS = {
    "Authorization": "Bearer top-secret",
    "X-Api-Key": "key-secret",
    "X-Amz-Security-Token": "token-secret",
}
NO_RETRY = Retry(max_retries=0)


@pytest.fixture
def other() -> Iterator[RawServer]:
    """A server on another port: another origin, which only answers ``other``."""
    with run_raw_server(lambda path, headers: response(body=b"other")) as server:
        yield server


def redirecting(target: str) -> Iterator[RawServer]:
    def handle(path: str, headers: dict[str, str]) -> bytes:
        if path == "/start":
            return response(302, headers={"Location": target})
        if path.startswith("/hop/"):
            left = int(path.split("/")[2])
            where = f"/hop/{left - 1}" if left else "/end"
            return response(307, headers={"Location": where})
        return response(body=b"same origin")

    with run_raw_server(handle) as server:
        yield server


def test_credential_headers_never_follow_a_redirect_to_another_origin(other: RawServer) -> None:
    for server in redirecting(other.url + "/landing"):
        out = first_item(HttpDataset([server.url + "/start"], headers=SECRETS))
        assert out == b"other"
        assert server.requests[0][1]["x-api-key"] == "key-secret"
        (path, seen), *_ = other.requests
        assert path == "/landing"
        assert not {name.lower() for name in SECRETS} & set(seen), seen


def test_headers_go_with_a_redirect_to_the_same_origin() -> None:
    for server in redirecting("/end"):
        assert first_item(HttpDataset([server.url + "/start"], headers=SECRETS)) == b"same origin"
        assert [path for path, _ in server.requests] == ["/start", "/end"]
        assert all(seen["x-amz-security-token"] == "token-secret" for _, seen in server.requests)


def test_a_scheme_relative_location_to_another_port_is_another_origin(other: RawServer) -> None:
    port = other.url.rsplit(":", 1)[1]
    for _ in redirecting(f"//127.0.0.1:{port}/x"):
        out = first_item(HttpDataset([_.url + "/start"], headers=SECRETS))
        assert out == b"other"
        assert "authorization" not in other.requests[0][1]


@pytest.mark.parametrize(
    ("limit", "chain", "ok"), [(0, 1, False), (1, 1, True), (3, 3, True), (3, 4, False)]
)
def test_max_redirects_follows_a_chain_of_n_and_fails_on_the_next(
    limit: int, chain: int, ok: bool
) -> None:
    for server in redirecting("/"):
        out = first_item(HttpDataset([f"{server.url}/hop/{chain - 1}"], max_redirects=limit))
        if ok:
            assert out == b"same origin"
        else:
            assert type(out) is OSError
            assert f"more than max_redirects={limit} redirects" in str(out)
        assert len(server.requests) == min(chain, limit) + 1


@pytest.mark.parametrize("value", [None, -1, 2.5, "3", True])
def test_max_redirects_is_checked_at_construction(value: object) -> None:
    with pytest.raises((TypeError, ValueError), match="max_redirects"):
        HttpDataset(["http://127.0.0.1/"], max_redirects=value)  # type: ignore[arg-type]


NOT_FOLLOWED = {
    "302 without Location": response(302),
    "301 empty Location": response(301, headers={"Location": ""}),
    "302 to file:": response(302, headers={"Location": "file:///etc/passwd"}),
    "303 to javascript:": response(303, headers={"Location": "javascript:alert(1)"}),
    "308 unparsable": response(308, headers={"Location": "http://[::1"}),
    "304": response(304),
    "300": response(300, body=b"choices"),
    "399": response(399, body=b"odd"),
}


@pytest.mark.parametrize("case", sorted(NOT_FOLLOWED))
def test_a_3xx_that_is_not_followed_fails_its_item(case: str) -> None:
    reply = NOT_FOLLOWED[case]
    with run_raw_server(lambda path, headers: reply) as server:
        out = first_item(HttpDataset([server.url + "/x"], retry=NO_RETRY))
    assert type(out) is OSError, out
    assert "HTTP 3" in str(out)
    assert len(server.requests) == 1


NOT_THE_OBJECT = {
    "206 unasked": response(206, b"hello", {"Content-Range": "bytes 0-4/100"}),
    "202": response(202, b"queued"),
    "226": response(226, b"delta"),
    "201": response(201, b"made"),
    "299": response(299, b"odd"),
}


@pytest.mark.parametrize("case", sorted(NOT_THE_OBJECT))
def test_a_2xx_that_is_not_the_whole_object_fails_its_item(case: str) -> None:
    # A 206 to a GET that asked no range was delivered as the whole item: 5 bytes of a
    # 100-byte object, silently; a 202's body (a status, not the object) as the item too.
    reply = NOT_THE_OBJECT[case]
    with run_raw_server(lambda path, headers: reply) as server:
        out = first_item(HttpDataset([server.url + "/x"], retry=Retry(3, 0.01, 0.01)))
        ended, chunks = streamed(HttpDataset([server.url + "/x"], retry=NO_RETRY))
    for failure in (out, ended):
        assert type(failure) is OSError, failure
        assert f"HTTP {case[:3]}" in str(failure)
        assert "not the whole object" in str(failure)
    assert chunks == []
    assert len(server.requests) == 2, "not worth another attempt"


def test_a_204_is_an_empty_item() -> None:
    with run_raw_server(lambda path, headers: response(204)) as server:
        assert first_item(HttpDataset([server.url + "/x"], retry=NO_RETRY)) == b""


GZIPPED = gzip.compress(b"hello", mtime=0)
TWICE = gzip.compress(GZIPPED, mtime=0)

MALFORMED = {
    "bad length": (response(body=b"abc", headers={"Content-Length": "abc"}), "Content-Length"),
    "negative length": (response(body=b"abc", headers={"Content-Length": "-3"}), "Content-Length"),
    "two lengths": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
        ("Duplicate Content-Length", "Duplicate 'Content-Length'"),  # the strict parser's
    ),
    "1 MiB header": (response(body=b"abc", headers={"X-Big": "a" * (1 << 20)}), "more than"),
    "many headers": (
        b"HTTP/1.1 200 OK\r\n"
        + b"".join(b"X-%d: 1\r\n" % i for i in range(300))
        + b"Content-Length: 1\r\n\r\na",
        "Too many headers",
    ),
    "bad status": (b"HTTP/1.1 abc OK\r\nContent-Length: 1\r\n\r\na", "Bad status line"),
    "not http": (b"SSH-2.0-OpenSSH\r\n\r\n", "Bad status line"),
    "corrupt gzip": (
        response(body=b"\x1f\x8b\x08\x00not gzip at all", headers={"Content-Encoding": "gzip"}),
        "cannot be decoded",
    ),
    "unknown encoding": (
        response(body=b"abc", headers={"Content-Encoding": "snappy"}),
        "unsupported Content-Encoding 'snappy'",
    ),
    "br without Brotli": (
        response(body=b"abc", headers={"Content-Encoding": "br"}),
        "content-encoding: brotli",
    ),
    # Each of these was delivered still encoded, with no error: aiohttp decodes no transfer
    # coding but chunked, and of several Content-Encoding fields it decodes one (the last)
    # while the check read another (the first).
    "a gzip transfer coding": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(GZIPPED), GZIPPED),
        "unsupported Transfer-Encoding 'gzip, chunked'",
    ),
    "a gzip transfer coding to the close": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n" + GZIPPED,
        "unsupported Transfer-Encoding 'gzip'",
    ),
    "two Transfer-Encoding fields": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(GZIPPED), GZIPPED),
        # llhttp in its strict mode (aiohttp's under `python -X dev`) refuses it itself
        ("unsupported Transfer-Encoding 'gzip, chunked'", "Duplicate 'Transfer-Encoding'"),
    ),
    "two Content-Encoding fields": (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Encoding: gzip\r\n"
        + b"Content-Length: %d\r\n\r\n%s" % (len(TWICE), TWICE),
        "unsupported Content-Encoding 'gzip, gzip'",
    ),
    "gzip, then an unknown one in another field": (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Encoding: snappy\r\n"
        + b"Content-Length: %d\r\n\r\n%s" % (len(GZIPPED), GZIPPED),
        "unsupported Content-Encoding 'gzip, snappy'",
    ),
}


@pytest.mark.parametrize(
    ("parser", "flags"),
    [("python", []), ("llhttp, strict", ["-X", "dev"]), ("python, strict", ["-X", "dev"])],
)
def test_malformed_responses_fail_alike_whichever_parser_aiohttp_uses(
    parser: str, flags: list[str]
) -> None:
    # aiohttp parses with llhttp where its C extension is built, leniently unless in debug
    # mode, and in Python where it is not (AIOHTTP_NO_EXTENSIONS, PyPy, a platform without
    # its wheel). The Python parser took the first of two Content-Length fields that differ:
    # 3 bytes of "abcde" delivered as the item, no error.
    environment = {**os.environ, "AIOHTTP_NO_EXTENSIONS": "1" if "python" in parser else ""}
    test = f"{Path(__file__).relative_to(ROOT)}::test_malformed_responses_fail_once_saying_why"
    run = subprocess.run(
        [sys.executable, *flags, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"{len(MALFORMED)} passed" in run.stdout


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_responses_fail_once_saying_why(case: str) -> None:
    reply, reasons = MALFORMED[case]
    with run_raw_server(lambda path, headers: reply) as server:
        out = first_item(HttpDataset([server.url + "/x"], retry=Retry(3, 0.01, 0.01)))
    assert isinstance(out, OSError), out
    assert any(reason in str(out) for reason in ([reasons] if type(reasons) is str else reasons))
    assert "ClientResponseError" not in str(out)
    assert "aaaa" not in str(out)  # the response's own bytes are not echoed
    assert len(server.requests) == 1, "a malformed response is not worth another attempt"


def test_a_transfer_coding_left_undecoded_fails_streams_and_ranges_too() -> None:
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(GZIPPED), GZIPPED)
    whole = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked
    part = b"HTTP/1.1 206 Partial\r\nContent-Range: bytes 0-4/5\r\n" + whole[17:]

    async def ranged(url: str) -> Any:  # before, the first 5 bytes of the gzip stream
        dataset = HttpDataset([url], retry=NO_RETRY)
        try:
            return await dataset.get_range(url, 0, 5)
        except Exception as error:
            return error
        finally:
            await dataset.aclose()

    for reply in (whole, part):

        def handle(path: str, headers: dict[str, str], reply: bytes = reply) -> bytes:
            return reply

        with run_raw_server(handle) as server:
            if reply is part:
                out = asyncio.run(ranged(server.url + "/x"))
            else:
                out, chunks = streamed(HttpDataset([server.url + "/x"], retry=NO_RETRY))
                assert chunks == []
        assert type(out) is OSError, out
        assert "unsupported Transfer-Encoding 'gzip, chunked'" in str(out)


def test_a_stream_whose_server_never_gives_a_final_response_times_out() -> None:
    # A stream's timeout bounds each wait for data, not the whole body, and 1xx responses
    # (103 Early Hints) came within it: 200 of them, 10 s, were waited through before the
    # body, and a server that kept sending them held the stream (a shard) for ever.
    hint = b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
    reply: list[bytes | float] = [hint, 0.05] * 200
    reply.append(response(body=b"late"))
    with run_raw_server(lambda path, headers: reply) as server:
        out, chunks = streamed(HttpDataset([server.url + "/x"], timeout=0.5, retry=NO_RETRY))
    assert type(out) is TimeoutError, out
    assert "no response within 0.5 s" in str(out)
    assert chunks == []


def test_a_body_cut_short_is_retried_saying_how_much_came() -> None:
    reply = response(body=b"abc", headers={"Content-Length": "10"})
    with run_raw_server(lambda path, headers: reply) as server:
        out = first_item(HttpDataset([server.url + "/x"], retry=Retry(2, 0.01, 0.01)))
    assert isinstance(out, OSError)
    assert "received 3 of 10 bytes" in str(out)
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    "retry_after",
    [
        "Mon, 01 Jan 2024 00:00:00 +99999999999999999999",  # a zone past C's int: overflow
        "Fri, 31 Dec 9999 23:59:59 -2359",  # the furthest date there is
        "nan",
        "1e999",
        "-5",
        "\u00ff\u00fe",
    ],
)
def test_a_503_with_any_retry_after_is_retried_within_max_backoff(retry_after: str) -> None:
    # A date whose zone overflowed the standard library's arithmetic raised OverflowError
    # out of the request: the item failed at once, not retried, naming no URL.
    answers = iter(
        [response(status=503, headers={"Retry-After": retry_after}), response(body=b"after")]
    )
    with run_raw_server(lambda path, headers: next(answers)) as server:
        out = first_item(HttpDataset([server.url + "/x"], retry=Retry(1, 0.01, 0.01)))
    assert out == b"after"
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("encoding", "body"),
    [("gzip", gzip_bomb(256 << 20)), ("deflate", deflate_bomb(256 << 20))],
)
def test_bombs_are_cut_at_max_bytes_after_decoding(encoding: str, body: bytes) -> None:
    assert len(body) < 1 << 20  # a quarter of a GiB in under a MiB
    reply = response(body=body, headers={"Content-Encoding": encoding})
    with run_raw_server(lambda path, headers: reply) as server:
        out = first_item(HttpDataset([server.url + "/x"], max_bytes=1 << 20))
    assert type(out) is ValueError
    assert "over max_bytes=1048576" in str(out)
    assert len(server.requests) == 1


def test_a_trickling_body_times_out_per_attempt() -> None:
    reply: list[bytes | float] = [response(body=b"", headers={"Content-Length": "1000"})]
    reply += [b"x", 0.05] * 200
    with run_raw_server(lambda path, headers: reply) as server:
        out = first_item(HttpDataset([server.url + "/x"], timeout=0.5, retry=Retry(1, 0.01, 0.01)))
    assert type(out) is TimeoutError
    assert len(server.requests) == 2


def test_sessions_close_with_their_event_loop(server: FaultServer) -> None:
    """30 epochs, each on a loop of its own (asyncio.run): sockets do not pile up."""
    data = HttpDataset([server.url + "/ok/10"] * 8)
    loader = DataLoader(data, batch_size=4, item_concurrency=4, collate_fn=list)

    async def epoch() -> list[Any]:
        return [batch async for batch in loader]

    counts = []
    for _ in range(30):
        assert asyncio.run(epoch()) == [[_body(10)] * 4] * 2
        counts.append(len(os.listdir("/proc/self/fd")))
    loader.close()
    # The server runs in this process: its own sockets come and go by a few. A leak was 8
    # descriptors (the session's connections) for every loop.
    assert counts[-1] < counts[0] + 8, counts
    assert all(entry.session.closed for entry in data._sessions.values())


def _body(size: int) -> bytes:
    from .servers import body

    return body(size)


def test_many_loops_under_a_low_descriptor_limit_and_the_error_when_out_of_them(
    server: FaultServer,
) -> None:
    """A child with 64 descriptors runs 100 epochs on loops of their own; then, with its
    descriptors used up on purpose, a request fails saying so."""
    script = textwrap.dedent(
        f"""
        import asyncio, resource
        from asyncloader import DataLoader, HttpDataset, Retry
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        data = HttpDataset([{server.url!r} + "/ok/5"] * 4, retry=Retry(0))
        loader = DataLoader(data, batch_size=4, item_concurrency=4, collate_fn=list)
        async def epoch():
            return [batch async for batch in loader]
        for _ in range(100):
            assert len(asyncio.run(epoch())) == 1
        print("100 epochs")
        hoard = []
        try:
            while True:
                hoard.append(open("/dev/null"))
        except OSError:
            pass
        hoard.pop().close()  # room for the loop's own descriptors, none for a socket
        hoard.pop().close()
        hoard.pop().close()
        try:
            asyncio.run(epoch())
        except OSError as error:
            print(type(error).__name__, error)
        for file in hoard:
            file.close()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "100 epochs"
    assert "Too many open files" in lines[1], lines


def test_close_calls_aclose_after_async_for_use() -> None:
    class Counting:
        closed = 0

        def __len__(self) -> int:
            return 4

        async def __getitem__(self, index: int) -> int:
            return index

        async def aclose(self) -> None:
            Counting.closed += 1

    loader = DataLoader(Counting(), batch_size=2)

    async def epoch() -> int:
        return len([batch async for batch in loader])

    assert asyncio.run(epoch()) == 2
    loader.close()
    assert Counting.closed == 1
    loader.close()
    assert Counting.closed == 1


@contextlib.contextmanager
def many_origins(count: int) -> Iterator[list[str]]:
    """``count`` aiohttp servers, each on a port of its own (an origin each), in a thread:
    the URL of one item on each."""
    ready: list[list[str]] = []
    stop: list[Callable[[], object]] = []
    started = threading.Event()

    async def serve() -> None:
        app = web.Application()

        async def item(request: web.Request) -> web.Response:
            return web.Response(body=b"x" * 10)

        app.router.add_get("/{key}", item)
        runner = web.AppRunner(app)
        await runner.setup()
        urls = []
        for key in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            await web.SockSite(runner, sock).start()
            urls.append(f"http://127.0.0.1:{sock.getsockname()[1]}/{key}")
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(done.set))
        ready.append(urls)
        started.set()
        await done.wait()
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(60), "the servers did not start"
    try:
        yield ready[0]
    finally:
        stop[0]()
        thread.join(10)


def test_a_dataset_over_many_origins_keeps_few_connections_idle() -> None:
    # Each origin's connection was kept for its next request (aiohttp keeps every idle one
    # 15 s, unbounded): 400 origins read once each held about 800 descriptors (both ends
    # here), and a dataset of image URLs on as many hosts ran out of descriptors ("Too many
    # open files") after about a thousand items.
    with many_origins(400) as urls:
        before = len(os.listdir("/proc/self/fd"))
        peak = 0
        dataset = HttpDataset(urls, retry=NO_RETRY)
        with DataLoader(dataset, batch_size=10, num_workers=2, item_concurrency=4) as loader:
            for batch in loader:
                assert len(batch) == 10
                peak = max(peak, len(os.listdir("/proc/self/fd")) - before)
    assert peak < 250, peak


def test_a_dataset_over_few_origins_keeps_its_connections(server: FaultServer) -> None:
    # Many items of one origin, and of 100 origins (past the 64 whose first requests keep
    # theirs) read again: each origin's connections are reused after its first request.
    urls = [f"{server.url}/ok/{i % 7}" for i in range(600)]
    earlier = set(server.connections)  # the server is the module's
    with DataLoader(HttpDataset(urls), batch_size=20, num_workers=2, item_concurrency=4) as loader:
        assert sum(len(batch) for batch in loader) == 600
    assert len(server.connections - earlier) <= 8 + 2  # those in flight, and a spare or two
    with many_origins(100) as origins:
        dataset = HttpDataset(origins * 5, retry=NO_RETRY)
        gc.collect()  # an earlier test's garbage freed during the epoch would hide its sockets
        before = len(os.listdir("/proc/self/fd"))
        with DataLoader(dataset, batch_size=10, num_workers=2, item_concurrency=4) as loader:
            assert sum(len(batch) for batch in loader) == 500
            held = len(os.listdir("/proc/self/fd")) - before
    assert held >= 2 * 90  # both ends of a connection kept for (nearly) every origin
