"""A TCP proxy on 127.0.0.1 that cuts the responses to GETs of one path part way.

For a server whose own responses cannot be scripted (moto's S3 server): each connection is
relayed byte for byte, and the first ``cuts`` responses to a GET whose request line holds
``target`` end ``after`` bytes in, both sockets closed there, as a network that drops a long
download does. ``on_cut`` runs at each cut, before the client sees it end (to replace the
object, say). Requests on a connection follow each other (no pipelining), so the request
a response answers is the last one whose head went up.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .raw_server import accepting

_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


@dataclass
class CuttingProxy:
    """A running proxy; ``requests`` holds each request's line and ``Range`` header."""

    target: str
    cuts: int
    after: int
    on_cut: Callable[[], None] | None = None
    url: str = ""
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    cut: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    sockets: list[socket.socket] = field(default_factory=list)


def _request(head: bytes) -> tuple[str, str | None]:
    lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    ranges = [line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("range:")]
    return lines[0], ranges[0] if ranges else None


def _relay(proxy: CuttingProxy, client: socket.socket, port: int) -> None:
    upstream = socket.create_connection(("127.0.0.1", port))
    with proxy.lock:
        proxy.sockets += [client, upstream]
    current: list[tuple[str, str | None]] = []
    """The request being answered (set before it goes up, so before its response comes)."""

    def up() -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if data.startswith(_METHODS):
                    request = _request(data)
                    with proxy.lock:
                        proxy.requests.append(request)
                    current[:] = [request]
                upstream.sendall(data)
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, daemon=True).start()
    sent, answering = 0, None
    try:
        while data := upstream.recv(65536):
            request = current[0] if current else None
            if request is not answering:
                sent, answering = 0, request
            cutting = (
                request is not None
                and request[0].startswith("GET ")
                and proxy.target in request[0]
                and sent + len(data) > proxy.after
            )
            with proxy.lock:
                cutting = cutting and proxy.cut < proxy.cuts
                proxy.cut += cutting
            if cutting:
                client.sendall(data[: proxy.after - sent])
                if proxy.on_cut is not None:
                    proxy.on_cut()
                for sock in (client, upstream):  # close() alone would not end a recv
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return
            client.sendall(data)
            sent += len(data)
    except OSError:
        return
    finally:
        client.close()
        upstream.close()


@contextlib.contextmanager
def run_cutting_proxy(
    port: int, target: str, cuts: int, after: int, on_cut: Callable[[], None] | None = None
) -> Iterator[CuttingProxy]:
    """Relay 127.0.0.1:``port`` (a thread per connection) until the block ends."""
    proxy = CuttingProxy(target, cuts, after, on_cut)
    with accepting(lambda conn, stop: _relay(proxy, conn, port)) as url:
        proxy.url = url
        try:
            yield proxy
        finally:
            with proxy.lock:
                for sock in proxy.sockets:  # ends the relays blocked in recv
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
