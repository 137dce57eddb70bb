"""Training from WebDataset tar shards, with a checkpoint in the middle of an epoch.

Run: ``.venv/bin/python examples/train_shards.py``. It writes 8 shards of 128 samples (8
features as ``.npy``, a label as ``.cls``) to a temporary folder, streams them with
``TarShards`` (shards shuffled, 2 read at once, samples mixed in a buffer of 256), trains a
tiny torch model for 2 epochs, then shows that a loader restored from a state saved after 5
batches gives exactly the batches that followed.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncloader import DataLoader, FileDataset, TarShards


def write_shards(folder: Path) -> list[str]:
    names = []
    for shard in range(8):
        with tarfile.open(folder / f"train-{shard:04d}.tar", "w") as archive:
            for i in range(128):
                rng = np.random.default_rng(shard * 1000 + i)
                features = rng.normal(size=8).astype(np.float32)
                array = io.BytesIO()
                np.save(array, features)
                for extension, data in (
                    ("npy", array.getvalue()),
                    ("cls", str(int(features.sum() > 0)).encode()),
                ):
                    info = tarfile.TarInfo(f"{shard:04d}{i:05d}.{extension}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        names.append(f"train-{shard:04d}.tar")
    return names


def decode(index: int, sample: dict[str, Any]) -> dict[str, Any]:
    """Runs on the loader's CPU threads: bytes to arrays."""
    return {"x": np.load(io.BytesIO(sample["npy"])), "y": int(sample["cls"])}


def make_loader(folder: Path, names: list[str]) -> DataLoader:
    shards = TarShards(
        FileDataset(names, root=folder), interleave=2, shuffle=True, shuffle_buffer=256
    )
    return DataLoader(shards, batch_size=32, num_workers=2, transform=decode, seed=0)


def main() -> None:
    torch.manual_seed(0)  # the same weights, so the same losses, every run
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        names = write_shards(folder)
        with make_loader(folder, names) as loader:
            for epoch in range(2):
                total, batches = 0.0, 0
                for batch in loader:
                    x, y = torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()  # type: ignore[no-untyped-call,unused-ignore]
                    optimizer.step()
                    total, batches = total + loss.item(), batches + 1
                print(f"epoch {epoch}: mean loss {total / batches:.3f}")

        # A checkpoint after 5 batches, and a fresh loader restored from it.
        with make_loader(folder, names) as loader:
            batches_left = iter(loader)
            for _ in range(5):
                next(batches_left)
            state = loader.state_dict()
            rest = [batch["y"].tolist() for batch in batches_left]
        with make_loader(folder, names) as restored:
            restored.load_state_dict(state)
            again = [batch["y"].tolist() for batch in restored]
        print(f"resumed after 5 batches: the same {len(rest)} batches: {again == rest}")


if __name__ == "__main__":
    main()
