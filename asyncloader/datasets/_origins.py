"""Which requests keep their connection for the next one, and how many connections open.

aiohttp keeps every idle connection in its pool until its keep-alive time-out (15 s), however
many there are: a dataset of URLs on many hosts (image URLs, one host each) holds one
descriptor per host read in the last 15 s, and runs out of them (``EMFILE``) after about a
thousand hosts. So once a dataset has met more than :data:`MANY` origins, the first request
to each new origin asks the server to close the connection after it (``Connection: close``):
only an origin met again keeps a connection, and the idle ones stay about as many as the
origins a dataset reads more than once.

Each connection open is a descriptor too: a session opens at most half as many as the
process may (:func:`connection_limit`), so that more requests in flight than that wait for a
connection, where each socket past the limit failed to open and was retried. aiohttp's
connector keeps that limit; for a client that has none (obstore's), :class:`Gates` does.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from .._settings import spare_descriptors

MANY: Final = 64
"""Origins whose first requests keep their connections."""

FORGOTTEN_AT: Final = 1 << 16
"""Origins remembered at most: past it the record starts again (memory stays bounded; an
origin met again then pays one more connection)."""


class Origins:
    """The origins a dataset's requests went to, and whether each was met again."""

    def __init__(self) -> None:
        self._met: dict[str, bool] = {}

    def close_after(self, url: str) -> bool:
        """Whether the request to ``url`` (a URL string) should close its connection: the
        first to its origin once more than :data:`MANY` origins were met."""
        start = url.find("//") + 2
        end = url.find("/", start)
        origin = url if end < 0 else url[:end]
        met = self._met
        again = met.get(origin)
        if again is None:
            if len(met) >= FORGOTTEN_AT:
                met.clear()
            met[origin] = False
            return len(met) > MANY
        if not again:
            met[origin] = True
        return False


def connection_limit() -> int:
    """The most connections a session opens at once (aiohttp's ``limit``; 0: no limit): the
    process's spare descriptors."""
    return spare_descriptors() or 0


class Gates:
    """For each event loop, at most :func:`connection_limit` calls at once (``None``: no
    limit), for a client that opens a connection for each request in flight. A copy of it
    (another process's) starts with none."""

    def __init__(self) -> None:
        self._gates: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore | None]] = {}

    def here(self) -> asyncio.Semaphore | None:
        """The running loop's gate."""
        loop = asyncio.get_running_loop()
        entry = self._gates.get(id(loop))
        if entry is not None and entry[0] is loop:
            return entry[1]
        for key in [key for key, (other, _) in self._gates.items() if other.is_closed()]:
            del self._gates[key]
        limit = connection_limit()
        gate = asyncio.Semaphore(limit) if limit else None
        self._gates[id(loop)] = (loop, gate)
        return gate

    def __getstate__(self) -> dict[str, Any]:
        return {"_gates": {}}
