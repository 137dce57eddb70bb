"""The reference fetch loop of the HTTP workloads: bare asyncio + aiohttp, no loader."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def bare(url: str, items: int, in_flight: int, done: Callable[[], None] | None = None) -> int:
    """GET ``{url}/samples/{i}`` for every ``i`` below ``items``, ``in_flight`` at once;
    ``done()`` after each."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        indices = iter(range(items))

        async def lane() -> None:
            for index in indices:
                async with session.get(f"{url}/samples/{index}") as response:
                    await response.read()
                if done is not None:
                    done()

        await asyncio.gather(*(lane() for _ in range(in_flight)))
    return items


async def stream_whole(
    urls: list[str], in_flight: int, sample_bytes: int, done: Callable[[int], None]
) -> int:
    """GET every URL, ``in_flight`` at once, each body streamed whole and dropped;
    ``done(n)`` for every ``n`` samples of ``sample_bytes`` that arrived. Returns the bytes."""
    import aiohttp

    total = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        pending = iter(urls)

        async def lane() -> None:
            nonlocal total
            for url in pending:
                left = 0
                async with session.get(url) as response:
                    response.raise_for_status()
                    async for chunk in response.content.iter_chunked(1 << 16):
                        total += len(chunk)
                        left += len(chunk)
                        if left >= sample_bytes:
                            done(left // sample_bytes)
                            left %= sample_bytes

        await asyncio.gather(*(lane() for _ in range(in_flight)))
    return total
