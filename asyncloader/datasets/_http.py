"""``HttpDataset``: items fetched with HTTP GET on aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._settings import check_int, check_timeout
from ._fast_urls import path_urls
from ._locations import Locations
from ._origins import Origins, connection_limit
from ._proxies import Proxies
from ._ranges import RangeFile, encoded
from ._redact import redact_text, redact_url
from ._retry import AttemptFailed, Retry, retrying
from ._streaming import Blocking, Sink

if TYPE_CHECKING:
    import aiohttp
    import yarl

TRANSIENT_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses worth another attempt; every other error status fails at once."""

WHOLE: Final = frozenset({200, 203, 204})
"""The statuses whose body is the object a GET without a range asked for: not a 206's part
of it, a 202's note that the request is queued, nor a 226's delta to apply."""

REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
"""The statuses whose ``Location`` is followed (a GET stays a GET)."""

DECODED_ENCODINGS: Final = frozenset({"", "identity", "gzip", "x-gzip", "deflate", "br", "zstd"})
"""``Content-Encoding`` values aiohttp decodes (``br``/``zstd`` with their optional package; it
says so when that is missing). A body in any other encoding would reach the user undecoded."""

CLOSE_TIMEOUT_S: Final = 5.0


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds, or an HTTP-date from now."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):  # a zone past C's int
            return None
        if when.tzinfo is None:  # an HTTP-date is GMT; a date without a zone is taken so
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        return max(seconds, 0.0)
    return seconds if 0 <= seconds < float("inf") else None


def _check_max_bytes(max_bytes: object) -> int | None:
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes must be an int or None, got {max_bytes!r}")
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be at least 0, got {max_bytes!r}")
    return max_bytes


def _reason(error: BaseException) -> str:
    """The first line of a client error's reason, short and redacted: a hostile response's
    own bytes are quoted in aiohttp's messages, so they are cut, never echoed whole."""
    cause = error.__cause__ if error.__cause__ is not None else error
    lines = redact_text(str(getattr(cause, "message", None) or cause)).strip().splitlines()
    line = re.split(r":?\s*b['\"]", lines[0] if lines else "")[0]  # aiohttp quotes the
    line = line.rstrip(":").strip() or type(cause).__name__  # response's bytes after it
    return line if len(line) <= 120 else line[:117] + "..."


async def _keep_until_loop_closes(
    session: aiohttp.ClientSession,
) -> AsyncGenerator[None, None]:
    """Closes ``session`` when its loop shuts down its async generators (``asyncio.run``,
    ``asyncio.Runner``, the loader's own loop thread) or when the dataset closes it."""
    try:
        yield
    finally:
        await session.close()


_CHANGED: Final = "the object changed while it was read"

_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header name (RFC 9110's token)."""
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""What no header value may hold: a CR or LF would end the header, a NUL cut it."""
_FRAMING: Final = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"}
)
"""Headers that frame a request or manage its connection: the client's own. A GET sent with
``Content-Length: 5`` and no body makes a server that believes it read the next request on
the connection as this one's body."""


_CONDITIONS: Final = frozenset(
    {"range", "if-range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since"}
)
"""Headers that make a GET answer a part of the object (206) or none of it (304, 412)."""


def _check_headers(headers: dict[str, str]) -> None:
    """Refuse, naming the header but never echoing a value (it may be a secret), a header
    that cannot go out as it is."""
    named: dict[str, str] = {}
    for name, value in headers.items():
        other = named.setdefault(name.lower(), name)
        if other != name:
            raise ValueError(
                f"headers {other[:40]!r} and {name[:40]!r} are one header (names are not "
                "case-sensitive): give it once"
            )
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"headers: {name[:40]!r} is not a header name")
        if _CONTROL.search(value):
            raise ValueError(f"headers[{name!r}] has a control character (CR, LF, NUL...)")
        if name.lower() in _FRAMING:
            raise ValueError(
                f"headers[{name!r}] frames the request or manages its connection, which "
                "the HTTP client does"
            )
        if name.lower() in _CONDITIONS:
            raise ValueError(
                f"headers[{name!r}] decides what a GET answers (a part of the object, or "
                "none): items are read whole, and Parquet's ranges set their own"
            )


@dataclass(frozen=True)
class _Version:
    """Which object a range response was of: its size, and its ETag if the server gave one."""

    size: int
    etag: str | None

    def same(self, other: _Version) -> bool:
        """Whether ``other`` may be the same object (an ETag is compared when both have one)."""
        tags = self.etag is None or other.etag is None or self.etag == other.etag
        return self.size == other.size and tags

    def __str__(self) -> str:
        shown = "no ETag" if self.etag is None else f"ETag {self.etag[:80]!r}"
        return f"{self.size} bytes, {shown}"


class _Session:
    """One event loop's session, and the generator that closes it with the loop."""

    __slots__ = ("keeper", "loop", "session")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        session: aiohttp.ClientSession,
        keeper: AsyncGenerator[None, None],
    ) -> None:
        self.loop = loop
        self.session = session
        self.keeper = keeper


class HttpDataset:
    """An async dataset whose item ``i`` is the body of ``GET locations[i]``, as ``bytes``.

    One ``aiohttp.ClientSession`` per event loop that drives the dataset, created lazily in
    that loop (so ``for``, ``async for`` and a forked child each get their own) and closed
    when that loop shuts down (``asyncio.run`` ending, the loader closing its own loop) or when
    the loader is closed. The session sets no connection limit of its own: the loader bounds
    the requests in flight (``max(num_workers, 1) * item_concurrency``), and idle connections
    are kept alive for the next requests. TLS certificates are verified. No cookies are kept.

    Redirects (301, 302, 303, 307, 308) are followed by the dataset itself: to the same
    origin (scheme, host and port) with ``headers``; to another origin with none of them (nor
    anywhere after it in the chain), so that a credential header (``Authorization``,
    ``X-Api-Key``, a session token) never reaches a host it was not meant for; never from
    ``https`` to ``http``, nor to another scheme. A
    3xx that is not followed (no usable ``Location``, 304, 300) fails its item.

    Proxies are the environment's, as curl, requests and obstore take them, read when the
    dataset is built: ``http_proxy``, ``https_proxy`` (a tunnel), ``all_proxy`` and
    ``no_proxy`` (names, addresses and ranges such as ``10.0.0.0/8``); never for a loopback
    host (see :mod:`._proxies`).

    Args:
        locations: A list of URLs, a function of the index, or a
            :class:`~asyncloader.Template` (values are percent-encoded). A template whose
            only field is ``{index}`` costs least per request: each URL is built from the
            origin, parsed once (where a parse would leave the URL as it is).
        length: The number of items, for a function or a template of scalars only.
        headers: Headers sent with every request to the locations' origins (never written to
            messages or logs, never sent to another origin). Refused here: a name that is not
            a header name, a value with a control character, and the headers that frame the
            request or manage its connection (``Content-Length``, ``Transfer-Encoding``,
            ``Connection``...), which are the client's, and those that make a GET answer a
            part of the object or none of it (``Range``, ``If-None-Match``...).
        timeout: Seconds one request may take, body included (a redirect is a new request).
        retry: How transient failures are retried (408, 429, 5xx gateways, refused or reset
            connections, truncated bodies, time-outs; ``Retry-After`` honoured, in seconds or
            as an HTTP-date).
        max_bytes: The largest body accepted (after decoding its ``Content-Encoding``):
            refused from ``Content-Length`` before reading, and a body that passes it while
            streaming is cut off at once.
        max_redirects: Redirects followed: ``0`` follows none, ``N`` a chain of ``N``; the
            ``N + 1``-st fails the item.

    Raises:
        ImportError: aiohttp is not installed (``pip install asyncloader[http]``).
        TypeError, ValueError: A setting is invalid (the message names it).
    """

    def __init__(
        self,
        locations: object,
        *,
        length: int | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        retry: Retry | None = None,
        max_bytes: int | None = None,
        max_redirects: int = 10,
    ) -> None:
        try:
            import aiohttp  # imported here so that aiohttp stays an optional dependency
            import yarl
        except ImportError as error:
            raise ImportError("HttpDataset needs aiohttp: pip install asyncloader[http]") from error
        self._aiohttp: Any = aiohttp
        self._url: Any = yarl.URL
        self.locations = Locations(locations, "url", length)
        self._urls = path_urls(self.locations)
        if headers is not None and not isinstance(headers, Mapping):
            raise TypeError(f"headers must be a mapping of str to str, got {type(headers)}")
        self.headers = dict(headers or {})
        self._origins = Origins()
        self._proxies = Proxies()
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()):
            raise TypeError("headers must be a mapping of str to str")
        _check_headers(self.headers)
        checked = check_timeout("timeout", timeout)
        if checked is None:
            raise ValueError("timeout must be a positive number of seconds, got None")
        self.timeout = checked
        self.retry = retry if retry is not None else Retry()
        if not isinstance(self.retry, Retry):
            raise TypeError(f"retry must be a Retry, got {retry!r}")
        self.max_bytes = _check_max_bytes(max_bytes)
        self.max_redirects = check_int("max_redirects", max_redirects, 0)
        self._pid = os.getpid()
        self._sessions: dict[int, _Session] = {}

    def __len__(self) -> int:
        return len(self.locations)

    def _current(self) -> aiohttp.ClientSession | None:
        """The running loop's open session, if it has one."""
        loop = asyncio.get_running_loop()
        entry = self._sessions.get(id(loop))
        if entry is not None and entry.loop is loop and not entry.session.closed:
            return entry.session
        return None

    async def _open_session(self) -> aiohttp.ClientSession:
        """Open the running loop's session (nothing here suspends, so lanes that start at
        once still share one session)."""
        loop = asyncio.get_running_loop()
        if self._pid != os.getpid():  # a forked child: the parent's sessions are not ours
            self._pid, self._sessions = os.getpid(), {}
        for key in [key for key, entry in self._sessions.items() if entry.loop.is_closed()]:
            del self._sessions[key]  # a loop closed without closing its generators
        client = self._aiohttp
        session: aiohttp.ClientSession = client.ClientSession(
            connector=client.TCPConnector(limit=connection_limit(), limit_per_host=0),
            timeout=client.ClientTimeout(total=self.timeout),
            cookie_jar=client.DummyCookieJar(),
        )
        keeper = _keep_until_loop_closes(session)
        # Its first step registers it with the loop's async-generator hooks; the loop's
        # shutdown_asyncgens() then closes the session while the loop still runs.
        await keeper.asend(None)
        self._sessions[id(loop)] = _Session(loop, session, keeper)
        return session

    async def __getitem__(self, index: int) -> bytes:
        url: str | yarl.URL
        if self._urls is None:
            location = self.locations[index]
            assert isinstance(location, str)
            url = location
        else:
            url = self._urls(index)
        session = self._current() or await self._open_session()
        try:  # the first attempt is made here: the retry loop is a frame around it only after
            body: bytes = await self._attempt(session, url)  # it failed
            return body
        except AttemptFailed as failure:
            failed = failure
        return await retrying(self.retry, lambda: self._attempt(session, url), failed)

    async def stream(self, index: int, sink: Sink, blocking: Blocking) -> None:
        """Item ``index``'s body, chunk by chunk into ``sink`` (which may wait, pausing the
        connection): one GET, with the redirects, headers, retries and limits of an item.
        A body cut part way is resumed where it stopped by a GET of the rest pinned to the
        object the first answer was of (``If-Match`` its strong ETag, its size and ETag
        compared), for as long as each attempt delivers bytes: ``retry`` bounds the attempts
        in a row that deliver none. One whose first answer gave no ``Content-Length`` or came
        encoded has no place to resume from, and fails once it gave bytes (they would come
        twice). ``timeout`` bounds the connection, the response's head (1xx responses
        included) and each wait for data, not the whole body, and aiohttp pauses it while
        ``sink`` waits. ``blocking`` is not needed."""
        url = self.locations[index]
        assert isinstance(url, str)
        timeout = self._aiohttp.ClientTimeout(sock_connect=self.timeout, sock_read=self.timeout)
        delivered = 0
        pinned: _Version | None = None
        """The object the first answer was of, where a cut in it can be resumed."""

        async def fill(response: aiohttp.ClientResponse, url: str) -> None:
            nonlocal delivered, pinned
            if delivered:
                assert pinned is not None
                self._check_range(response, url, f"bytes={delivered}-", delivered, None, pinned)
            else:
                self._check_encoding(response, url)
                self._check_declared(response, url)
                pinned = _pinned(response)
            # As the connection delivered them: no chunk is joined to another (a copy).
            async for chunk, _ in response.content.iter_chunks():
                size = delivered + len(chunk)
                if self.max_bytes is not None and size > self.max_bytes:
                    raise AttemptFailed(
                        ValueError(f"GET {redact_url(url)}: over max_bytes={self.max_bytes}"),
                        transient=False,
                    )
                if pinned is not None and size > pinned.size:
                    raise AttemptFailed(
                        OSError(f"GET {redact_url(url)}: longer than its {pinned.size} bytes"),
                        transient=False,
                    )
                delivered = size
                await sink(chunk)
            if pinned is not None and delivered < pinned.size:  # a chunked range, cut
                raise AttemptFailed(
                    OSError(f"GET {redact_url(url)}: ended at {delivered} of {pinned.size} bytes"),
                    transient=True,
                )

        async def attempt() -> None:
            extra = None
            if delivered:
                assert pinned is not None
                extra = _range_headers(f"bytes={delivered}-", pinned)
            try:
                await self._attempt(session, url, fill, timeout, extra)
            except AttemptFailed as failed:
                failed.transient = failed.transient and (not delivered or pinned is not None)
                raise

        session = self._current() or await self._open_session()
        await retrying(self.retry, attempt, progress=lambda: delivered)

    def open_file(self, index: int, loop: asyncio.AbstractEventLoop | None = None) -> RangeFile:
        """Item ``index`` as a file read anywhere in it on another thread (blocking), each
        read one ``Range`` GET made on ``loop`` (for a Parquet reader). A server that does not
        answer a range with 206 and the range asked for fails the read. Every read is of the
        version the first one sized: sent ``If-Match`` with its ETag, it fails if the object's
        size or ETag has changed since (the object was replaced while it was read)."""
        if loop is None:
            raise ValueError("HttpDataset.open_file needs the event loop that makes its requests")
        url = self.locations[index]
        assert isinstance(url, str)
        # Bounded: a loop that closes under a read must not leave this thread waiting forever.
        wait = self.timeout * (self.retry.max_retries + 1) + 60

        def get(start: int, length: int, version: _Version | None) -> tuple[bytes, _Version]:
            ranged = self.get_range(url, start, length, version)
            future = asyncio.run_coroutine_threadsafe(ranged, loop)
            return future.result(timeout=wait)

        first = get(0, 1, None)[1]
        if self.max_bytes is not None and first.size > self.max_bytes:
            raise ValueError(
                f"GET {redact_url(url)}: {first.size} bytes, over max_bytes={self.max_bytes}"
            )
        return RangeFile(first.size, lambda start, length: get(start, length, first)[0])

    async def get_range(
        self, url: str, start: int, length: int, version: _Version | None = None
    ) -> tuple[bytes, _Version]:
        """Bytes ``start`` to ``start + length - 1`` of ``url``'s body, and the version of the
        object they are of (its size and ETag); with ``version``, they must be of that one."""
        session = self._current() or await self._open_session()
        end = start + length - 1
        asked = f"bytes={start}-{end}"

        async def take(response: aiohttp.ClientResponse, url: str) -> tuple[bytes, _Version]:
            last, this = self._check_range(response, url, asked, start, end, version)
            data = await _read_at_most(response.content, last - start + 1, url)
            if len(data) != last - start + 1:
                shown = redact_url(url)
                raise AttemptFailed(OSError(f"GET {shown}: the range ended early"), transient=True)
            return data, this

        extra = _range_headers(asked, version)
        result: tuple[bytes, _Version] = await retrying(
            self.retry, lambda: self._attempt(session, url, take, None, extra)
        )
        return result

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        url: str | yarl.URL,
        consume: Any = None,
        timeout: Any = None,
        extra: dict[str, str] | None = None,
    ) -> Any:
        """One GET of ``url`` (a string, or parsed already), redirects followed; the body, or
        what ``consume(response, url)`` makes of the response."""
        aiohttp = self._aiohttp
        try:
            target = url
            # ``extra`` (a Range) is about the resource, not a credential: it goes everywhere.
            headers = self.headers or None
            if extra:  # in place of the user's own of those names, in any case
                names = {name.lower() for name in extra}
                kept = {k: v for k, v in self.headers.items() if k.lower() not in names}
                headers = {**kept, **extra}
            if type(url) is str and self._origins.close_after(url):
                headers = {**(headers or {}), "Connection": "close"}
            for hop in range(self.max_redirects + 1):
                proxy = self._proxies.for_url(target)
                request = (
                    session.get(target, allow_redirects=False, headers=headers, proxy=proxy)
                    if timeout is None
                    else self._head_within(
                        session.get(
                            target,
                            allow_redirects=False,
                            headers=headers,
                            proxy=proxy,
                            timeout=timeout,
                        ),
                        url,
                    )
                )
                async with request as response:
                    status = response.status
                    if 200 <= status < 300:
                        if status not in WHOLE and not (extra and "Range" in extra):
                            raise AttemptFailed(
                                OSError(
                                    f"GET {redact_url(url)}: HTTP {status}, not the whole "
                                    "object (a GET of one is answered 200, 203 or 204)"
                                ),
                                transient=False,
                            )
                        if consume is not None:
                            return await consume(response, url)
                        self._check_encoding(response, url)
                        if self.max_bytes is None:
                            return await response.read()
                        self._check_declared(response, url)
                        return await _read_at_most(response.content, self.max_bytes, url)
                    if status not in REDIRECTS:
                        raise AttemptFailed(
                            _status_error(status, redact_url(url)),
                            transient=status in TRANSIENT_STATUSES,
                            retry_after=_retry_after(response.headers.get("Retry-After")),
                        )
                    target = self._redirect(response, url, hop)
                    if target.origin() != self._url(url).origin():
                        headers = extra  # and only it again, wherever the chain goes next
            raise AssertionError("unreachable: the last hop raises")  # pragma: no cover
        except AttemptFailed:
            raise
        except asyncio.TimeoutError:
            raise AttemptFailed(
                TimeoutError(
                    f"GET {redact_url(url)}: no complete response within {self.timeout} s"
                ),
                transient=True,
            ) from None
        except aiohttp.ClientPayloadError as error:
            cause = error.__cause__
            if isinstance(cause, aiohttp.http_exceptions.ContentEncodingError):
                raise AttemptFailed(
                    OSError(
                        f"GET {redact_url(url)}: the body cannot be decoded ({_reason(error)})"
                    ),
                    transient=False,
                ) from None
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: the body ended early ({_reason(error)})"),
                transient=True,
            ) from None
        except aiohttp.ClientConnectionError as error:
            raise AttemptFailed(
                ConnectionError(
                    f"GET {redact_url(url)}: connection failed ({_connection_reason(error)})"
                ),
                transient=True,
            ) from None
        except aiohttp.ClientHttpProxyError as error:  # an https tunnel, refused
            raise AttemptFailed(
                ConnectionError(
                    f"GET {redact_url(url)}: the proxy refused the tunnel: HTTP {error.status}"
                ),
                transient=error.status in TRANSIENT_STATUSES,
            ) from None
        except aiohttp.ClientResponseError as error:  # the response could not be parsed
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: malformed response ({_reason(error)})"),
                transient=False,
            ) from None
        except (aiohttp.ClientError, ValueError) as error:
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: {type(error).__name__} ({_reason(error)})"),
                transient=False,
            ) from None

    @contextlib.asynccontextmanager
    async def _head_within(
        self, request: Any, url: str | yarl.URL
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A stream's response, its head (1xx responses too) within ``timeout``: the
        stream's own time-out bounds each wait for data, and a server may send 1xx
        responses without end, each within it."""
        try:
            # In this task, not one of wait_for's own: aiohttp ties a request to its task.
            async with self._aiohttp.helpers.ceil_timeout(self.timeout, ceil_threshold=1e9):
                response = await request
        except asyncio.TimeoutError:
            raise AttemptFailed(
                TimeoutError(f"GET {redact_url(url)}: no response within {self.timeout} s"),
                transient=True,
            ) from None
        async with response:
            yield response

    def _redirect(
        self, response: aiohttp.ClientResponse, url: str | yarl.URL, hop: int
    ) -> yarl.URL:
        """Where a redirect leads, if it may be followed; else the item fails."""
        shown = redact_url(url)
        status = response.status
        if hop == self.max_redirects:
            raise AttemptFailed(
                OSError(f"GET {shown}: HTTP {status}, more than max_redirects={hop} redirects"),
                transient=False,
            )
        location = response.headers.get("Location", "").strip()
        current = response.url
        try:
            target = current.join(self._url(location)).with_fragment(None) if location else None
        except (ValueError, TypeError):
            target = None
        if target is None or target.scheme not in ("http", "https") or not target.host:
            raise AttemptFailed(
                OSError(f"GET {shown}: HTTP {status} without a usable Location"),
                transient=False,
            )
        if current.scheme == "https" and target.scheme == "http":
            raise AttemptFailed(
                OSError(f"GET {shown}: HTTP {status} redirects from https to http"),
                transient=False,
            )
        return target

    def _check_range(
        self,
        response: aiohttp.ClientResponse,
        url: str | yarl.URL,
        asked: str,
        start: int,
        end: int | None,
        version: _Version | None,
    ) -> tuple[int, _Version]:
        """The last byte of the range a response to ``asked`` holds (from ``start`` to
        ``end``, or to the object's end), and the object it is of: which must be ``version``
        where one is given. Any other answer fails the attempt for good."""
        shown = redact_url(url)
        given = response.headers.get("Content-Range", "")
        match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", given.strip())
        self._check_encoding(response, url)
        refused = encoded(f"GET {shown}", _field(response, "Content-Encoding"))
        if response.status == 206 and refused is not None:
            raise AttemptFailed(refused, transient=False)
        if response.status != 206 or match is None:
            raise AttemptFailed(
                OSError(
                    f"GET {shown}: HTTP {response.status}, not the range asked for "
                    "(the server does not serve byte ranges)"
                ),
                transient=False,
            )
        first, last, total = (int(v) for v in match.groups())
        whole = last == total - 1 if end is None else last <= end
        if first != start or last < first or not whole:
            raise AttemptFailed(
                OSError(f"GET {shown}: the server sent {given[:60]!r} for {asked!r}"),
                transient=False,
            )
        this = _Version(total, response.headers.get("ETag"))
        if version is not None and not version.same(this):
            raise AttemptFailed(
                OSError(f"GET {shown}: {_CHANGED} ({version} before, {this} now)"),
                transient=False,
            )
        declared = response.content_length
        if declared is not None and declared != last - first + 1:
            raise AttemptFailed(
                OSError(
                    f"GET {shown}: Content-Length {declared} for a range of "
                    f"{last - first + 1} bytes"
                ),
                transient=False,
            )
        return last, this

    def _check_encoding(self, response: aiohttp.ClientResponse, url: str | yarl.URL) -> None:
        """Refuse a body that aiohttp would hand over still encoded: a transfer coding but
        chunked, or a content coding it does not decode. Several fields of one name are one
        list (RFC 9110, 5.3), of which aiohttp decodes only one. Refuse a body of two
        lengths too, which aiohttp's Python parser reads at the first."""
        headers = response.headers
        lengths = headers.getall("Content-Length", ())
        if len(lengths) > 1 and len(set(lengths)) > 1:
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: malformed response (Duplicate Content-Length)"),
                transient=False,
            )
        if "Transfer-Encoding" not in headers and "Content-Encoding" not in headers:
            return  # most bodies, checked once an item: nothing more to read
        transfer = _field(response, "Transfer-Encoding")
        if transfer and transfer != "chunked":
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: unsupported Transfer-Encoding {transfer[:40]!r}"),
                transient=False,
            )
        encoding = _field(response, "Content-Encoding")
        if encoding not in DECODED_ENCODINGS:
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: unsupported Content-Encoding {encoding[:40]!r}"),
                transient=False,
            )

    def _check_declared(self, response: aiohttp.ClientResponse, url: str | yarl.URL) -> None:
        """Refuse a body whose ``Content-Length`` is over ``max_bytes`` before reading it (an
        encoded one is checked as it is decoded)."""
        declared = response.content_length
        if self.max_bytes is None or declared is None:
            return
        encoding = _field(response, "Content-Encoding")
        if encoding not in ("", "identity"):
            return
        if declared > self.max_bytes:
            raise AttemptFailed(
                ValueError(
                    f"GET {redact_url(url)}: Content-Length {declared} is over "
                    f"max_bytes={self.max_bytes}"
                ),
                transient=False,
            )

    async def aclose(self) -> None:
        """Close the sessions: this loop's awaited, another running loop's scheduled on it
        (not awaited: that loop may be the one blocked in this call's thread)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        if self._pid != os.getpid():
            return
        current = asyncio.get_running_loop()
        for entry in sessions:
            if entry.loop is current:
                await entry.keeper.aclose()
            elif not entry.loop.is_closed():
                try:
                    entry.loop.call_soon_threadsafe(_close_later, entry.keeper)
                except RuntimeError:  # closed in between
                    entry.session.detach()
            else:  # its loop is gone with its connections: nothing left to close
                entry.session.detach()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for another process) and deep-copied without its sessions, which belong
        to this process's event loops (the copy opens its own), nor the aiohttp module."""
        state = self.__dict__.copy()
        del state["_aiohttp"]
        state["_sessions"], state["_origins"] = {}, Origins()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        import aiohttp

        self.__dict__.update(state)
        self._aiohttp = aiohttp
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"HttpDataset({len(self)} items)"


_closing: set[asyncio.Future[None]] = set()
"""Closes scheduled on another loop, kept referenced until they end."""


def _field(response: aiohttp.ClientResponse, name: str) -> str:
    """The header ``name``'s values, lower-cased, as one list: ``""`` when it has none."""
    values = response.headers.getall(name, None)
    if values is None:  # most responses: no such header
        return ""
    return ", ".join([value.strip() for value in values]).lower()


def _range_headers(asked: str, version: _Version | None) -> dict[str, str]:
    """The headers of a GET of the range ``asked``, of the object ``version`` if given."""
    # A range is of the object's bytes as the server holds them: an encoding applied on the
    # way would make it a range of other bytes (RFC 9110, 14.1.1).
    extra = {"Range": asked, "Accept-Encoding": "identity"}
    if version is not None and version.etag and not version.etag.startswith("W/"):
        extra["If-Match"] = version.etag  # a weak ETag never matches (RFC 9110)
    return extra


def _pinned(response: aiohttp.ClientResponse) -> _Version | None:
    """The object a whole answer is of, where a cut in its body can be resumed: none when
    it gave no size, or came encoded (aiohttp hands over decoded bytes, which are not the
    stored ones a range counts)."""
    if response.content_length is None or _field(response, "Content-Encoding") not in (
        "",
        "identity",
    ):
        return None
    return _Version(response.content_length, response.headers.get("ETag"))


def _close_later(keeper: AsyncGenerator[None, None]) -> None:
    task = asyncio.ensure_future(keeper.aclose())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def _connection_reason(error: BaseException) -> str:
    """Why a connection failed, with the system's words (``Too many open files``)."""
    os_error = getattr(error, "os_error", None)
    if isinstance(os_error, OSError) and os_error.strerror:
        return f"{type(error).__name__}: {os_error.strerror}"
    return type(error).__name__


def _status_error(status: int, shown: str) -> OSError:
    message = f"GET {shown}: HTTP {status}"
    if 300 <= status < 400:
        return OSError(f"{message}, a redirect that is not followed (no data)")
    if status < 200:
        return OSError(f"{message}, not a final response")
    if status in (404, 410):
        return FileNotFoundError(message)
    if status == 412:  # only a read pinned to a version sends a precondition (If-Match)
        return OSError(f"{message}, {_CHANGED} (its ETag no longer matches)")
    if status in (401, 403):
        return PermissionError(message)
    return OSError(message)


async def _read_at_most(content: Any, max_bytes: int, url: str | yarl.URL) -> bytes:
    """Read a body of unknown or untrusted length, failing as soon as it passes the limit."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await content.read(max_bytes + 1 - size)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise AttemptFailed(
                ValueError(f"GET {redact_url(url)}: the body is over max_bytes={max_bytes}"),
                transient=False,
            )
        chunks.append(chunk)
