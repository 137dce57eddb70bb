"""A plain ``for`` training loop over an async dataset, with a progress bar.

Run: ``.venv/bin/python examples/train_loop.py``. The dataset simulates a remote store: each
item takes 5 ms to "arrive"; the loader keeps 64 requests in flight and hands over batches in
order while the loop trains a tiny torch model.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from asyncloader import DataLoader


class RemoteVectors:
    """1,024 samples of 8 features and a label, each taking 5 ms to fetch."""

    def __len__(self) -> int:
        return 1024

    async def __getitem__(self, index: int) -> dict[str, Any]:
        await asyncio.sleep(0.005)
        rng = np.random.default_rng(index)
        features = rng.normal(size=8).astype(np.float32)
        return {"x": features, "y": int(features.sum() > 0)}


def main() -> None:
    torch.manual_seed(0)  # the same weights, so the same losses, every run
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        RemoteVectors(), batch_size=32, shuffle=True, seed=0, num_workers=4, item_concurrency=16
    )
    with loader:
        for epoch in range(2):
            total = 0.0
            for batch in tqdm(loader, desc=f"epoch {epoch}"):
                x, y = torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call,unused-ignore]
                optimizer.step()
                total += loss.item()
            print(f"epoch {epoch}: mean loss {total / len(loader):.3f}")


if __name__ == "__main__":
    main()
