"""A raw-socket HTTP server on 127.0.0.1 that answers exactly the bytes a test scripts.

aiohttp's own server refuses to send malformed responses; this one sends anything: wrong
lengths, headers of a megabyte, bodies that trickle, bombs under any ``Content-Encoding``,
redirects of every kind. Each connection reads one request's head and hands the path to the
test's handler, which returns the response as bytes or as a list of ``bytes`` and ``float``
(seconds to pause) parts; the connection is then closed.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

Part = bytes | float
Handler = Callable[[str, dict[str, str]], bytes | list[Part]]


def response(
    status: int = 200,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    reason: str = "X",
    length: bool = True,
) -> bytes:
    """An HTTP/1.1 response's bytes; ``Content-Length`` is the body's unless given or off."""
    fields = dict(headers or {})
    if length and not any(name.lower() == "content-length" for name in fields):
        fields["Content-Length"] = str(len(body))
    fields.setdefault("Connection", "close")
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return head.encode("latin-1") + b"\r\n" + body


def gzip_bomb(size: int) -> bytes:
    """``size`` zero bytes, gzipped (about a thousandth of ``size``)."""
    return gzip.compress(bytes(size), compresslevel=9)


def deflate_bomb(size: int) -> bytes:
    """``size`` zero bytes, zlib-deflated."""
    return zlib.compress(bytes(size), 9)


@dataclass
class RawServer:
    """A running server; ``requests`` holds each request's ``(path, headers)``."""

    handler: Handler
    url: str = ""
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)


def _read_head(conn: socket.socket) -> tuple[str, dict[str, str]] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return path, headers


def _serve(server: RawServer, conn: socket.socket, stop: threading.Event) -> None:
    with conn:
        try:
            head = _read_head(conn)
            if head is None:
                return
            server.requests.append(head)
            reply = server.handler(*head)
            for part in [reply] if isinstance(reply, bytes) else reply:
                if isinstance(part, float):
                    if stop.wait(part):
                        return
                else:
                    conn.sendall(part)
        except OSError:  # the client went away: that is its right
            return


@contextlib.contextmanager
def accepting(handle: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """Accept connections on 127.0.0.1, a thread each running ``handle(conn, stop)``,
    until the block ends (``stop`` is set then, and the threads are given 5 s to end);
    yields the ``http://`` URL of the port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()
    workers: list[threading.Thread] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            worker = threading.Thread(target=handle, args=(conn, stop), daemon=True)
            worker.start()
            workers.append(worker)

    acceptor = threading.Thread(target=accept, name="raw-server", daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(timeout=5)
        listener.close()
        deadline = time.monotonic() + 5
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def run_raw_server(handler: Handler) -> Iterator[RawServer]:
    """Serve ``handler`` on 127.0.0.1 (a thread per connection) until the block ends."""
    server = RawServer(handler)
    with accepting(lambda conn, stop: _serve(server, conn, stop)) as url:
        server.url = url
        yield server
