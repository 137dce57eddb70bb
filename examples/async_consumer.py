"""``async for`` inside your own event loop: the loader's epoch runs as tasks of your loop.

Run: ``.venv/bin/python examples/async_consumer.py``.
"""

from __future__ import annotations

import asyncio

from asyncloader import DataLoader


class Slow:
    """Items that take 10 ms each to arrive."""

    def __len__(self) -> int:
        return 256

    async def __getitem__(self, index: int) -> int:
        await asyncio.sleep(0.01)
        return index


async def main() -> None:
    async with DataLoader(Slow(), batch_size=16, num_workers=2, item_concurrency=16) as loader:
        seen: list[int] = []
        async for indices, batch in loader.aiter_with_indices():
            assert batch.tolist() == indices
            seen += indices
        in_order = seen == list(range(len(Slow())))
        print(f"{len(loader)} batches, {len(seen)} items, in order: {in_order}")


if __name__ == "__main__":
    asyncio.run(main())
