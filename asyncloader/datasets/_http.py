"""``HttpDataset``: items fetched with HTTP GET on aiohttp."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from .._settings import check_timeout
from ._locations import Locations
from ._redact import redact_url
from ._retry import AttemptFailed, Retry, retrying

if TYPE_CHECKING:
    import aiohttp

TRANSIENT_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses worth another attempt; every other error status fails at once."""

CLOSE_TIMEOUT_S: Final = 5.0


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the HTTP-date form is not honoured)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _check_max_bytes(max_bytes: object) -> int | None:
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes must be an int or None, got {max_bytes!r}")
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be at least 0, got {max_bytes!r}")
    return max_bytes


class HttpDataset:
    """An async dataset whose item ``i`` is the body of ``GET locations[i]``, as ``bytes``.

    One ``aiohttp.ClientSession`` per event loop that drives the dataset, created lazily in
    that loop (so ``for``, ``async for`` and a forked child each get their own) and closed
    with the loader. The session sets no connection limit of its own: the loader bounds the
    requests in flight (``max(num_workers, 1) * item_concurrency``), and idle connections are
    kept alive for the next requests. TLS certificates are verified; redirects are bounded.

    Args:
        locations: A list of URLs, a function of the index, or a
            :class:`~asyncloader.Template` (values are percent-encoded).
        length: The number of items, for a function or a template of scalars only.
        headers: Headers sent with every request (never written to messages or logs).
        timeout: Seconds one attempt may take, body included.
        retry: How transient failures are retried (408, 429, 5xx gateways, refused or reset
            connections, truncated bodies, time-outs; ``Retry-After`` honoured).
        max_bytes: The largest body accepted: refused from ``Content-Length`` before reading,
            and a body that passes it while streaming is cut off at once.
        max_redirects: Redirects followed before the item fails.

    Raises:
        ImportError: aiohttp is not installed (``pip install asyncloader[http]``).
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
        except ImportError as error:
            raise ImportError("HttpDataset needs aiohttp: pip install asyncloader[http]") from error
        self._aiohttp: Any = aiohttp
        self.locations = Locations(locations, "url", length)
        self.headers = dict(headers or {})
        checked = check_timeout("timeout", timeout)
        if checked is None:
            raise ValueError("timeout must be a positive number of seconds, got None")
        self.timeout = checked
        self.retry = retry if retry is not None else Retry()
        if not isinstance(self.retry, Retry):
            raise TypeError(f"retry must be a Retry, got {retry!r}")
        self.max_bytes = _check_max_bytes(max_bytes)
        self.max_redirects = max_redirects
        self._pid = os.getpid()
        self._sessions: dict[int, tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession]] = {}

    def __len__(self) -> int:
        return len(self.locations)

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        entry = self._sessions.get(id(loop))
        if entry is not None and entry[0] is loop and not entry[1].closed:
            return entry[1]
        if self._pid != os.getpid():  # a forked child: the parent's sessions are not ours
            self._pid, self._sessions = os.getpid(), {}
        client = self._aiohttp
        connector = client.TCPConnector(limit=0, limit_per_host=0)
        session: aiohttp.ClientSession = client.ClientSession(
            connector=connector,
            headers=self.headers,
            timeout=client.ClientTimeout(total=self.timeout),
        )
        self._sessions[id(loop)] = (loop, session)
        return session

    async def __getitem__(self, index: int) -> bytes:
        url = self.locations[index]
        assert isinstance(url, str)
        session = self._session()
        return await retrying(self.retry, lambda: self._attempt(session, url))

    async def _attempt(self, session: aiohttp.ClientSession, url: str) -> bytes:
        aiohttp = self._aiohttp
        try:
            async with session.get(url, max_redirects=self.max_redirects) as response:
                status = response.status
                if status >= 400:
                    raise AttemptFailed(
                        _status_error(status, redact_url(url)),
                        transient=status in TRANSIENT_STATUSES,
                        retry_after=_retry_after(response.headers.get("Retry-After")),
                    )
                if self.max_bytes is None:
                    return await response.read()
                declared = response.content_length
                if declared is not None and declared > self.max_bytes:
                    raise AttemptFailed(
                        ValueError(
                            f"GET {redact_url(url)}: Content-Length {declared} is over "
                            f"max_bytes={self.max_bytes}"
                        ),
                        transient=False,
                    )
                return await _read_at_most(response.content, self.max_bytes, url)
        except AttemptFailed:
            raise
        except asyncio.TimeoutError:
            raise AttemptFailed(
                TimeoutError(
                    f"GET {redact_url(url)}: no complete response within {self.timeout} s"
                ),
                transient=True,
            ) from None
        except aiohttp.ClientPayloadError:
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: the body ended before its Content-Length"),
                transient=True,
            ) from None
        except aiohttp.TooManyRedirects:
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: more than {self.max_redirects} redirects"),
                transient=False,
            ) from None
        except aiohttp.ClientConnectionError as error:
            raise AttemptFailed(
                ConnectionError(
                    f"GET {redact_url(url)}: connection failed ({type(error).__name__})"
                ),
                transient=True,
            ) from None
        except (aiohttp.ClientError, ValueError) as error:
            raise AttemptFailed(
                OSError(f"GET {redact_url(url)}: {type(error).__name__}"), transient=False
            ) from None

    async def aclose(self) -> None:
        """Close the sessions: this loop's awaited, another live loop's on that loop."""
        sessions, self._sessions = list(self._sessions.values()), {}
        if self._pid != os.getpid():
            return
        current = asyncio.get_running_loop()
        for loop, session in sessions:
            if loop is current:
                await session.close()
            elif loop.is_running() and not loop.is_closed():
                closing = asyncio.run_coroutine_threadsafe(session.close(), loop)
                await asyncio.wait_for(asyncio.wrap_future(closing), CLOSE_TIMEOUT_S)
            else:  # its loop is gone with its connections: nothing left to close
                session.detach()

    def __repr__(self) -> str:
        return f"HttpDataset({len(self)} items)"


def _status_error(status: int, shown: str) -> OSError:
    message = f"GET {shown}: HTTP {status}"
    if status in (404, 410):
        return FileNotFoundError(message)
    if status in (401, 403):
        return PermissionError(message)
    return OSError(message)


async def _read_at_most(content: Any, max_bytes: int, url: str) -> bytes:
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
