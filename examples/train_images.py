"""Train a tiny torch model for a few steps on images streamed through the loader.

Run: ``.venv/bin/python examples/train_images.py``. It writes 256 small JPEGs of two classes
(reddish or bluish) into a temporary folder, streams them with ``FileDataset``, decodes and
augments them on the loader's CPU pool, collates (and normalizes) each batch once into reused
memory, and hands it to torch without a copy.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from asyncloader import DataLoader, FileDataset, ImageCollator, Template
from asyncloader.transforms import Compose, Decode, RandomHorizontalFlip, RandomResizedCrop

IMAGES = 256


def write_images(folder: Path) -> None:
    """Image ``i`` is reddish for even ``i``, bluish for odd ``i``, with noise."""
    rng = np.random.default_rng(0)
    for index in range(IMAGES):
        pixels = rng.integers(0, 96, (48, 64, 3))
        pixels[:, :, 0 if index % 2 == 0 else 2] += 150
        out = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8)).save(out, "JPEG", quality=90)
        (folder / f"{index:04d}.jpg").write_bytes(out.getvalue())


def main() -> None:
    torch.manual_seed(0)  # the same weights, so the same losses, every run
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 2),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    # uint8 to the end of the chain: the collator scales, normalizes and lays out the batch
    # as it copies it (what ToFloat(), Normalize() and ToCHW() would do per item).
    augment = Compose([Decode(), RandomResizedCrop(32, scale=(0.5, 1.0)), RandomHorizontalFlip()])
    with tempfile.TemporaryDirectory() as folder:
        write_images(Path(folder))
        loader = DataLoader(
            FileDataset(Template("{index:04d}.jpg"), root=folder, length=IMAGES),
            batch_size=32,
            shuffle=True,
            seed=0,
            transform=augment,
            collate_fn=ImageCollator(mean=[0.5] * 3, std=[0.25] * 3, buffers=2),
            num_workers=2,
        )
        with loader:
            for epoch in range(3):
                losses = []
                for indices, batch in tqdm(loader.iter_with_indices(), total=len(loader)):
                    images = torch.from_numpy(batch)  # shares the batch's memory
                    labels = torch.tensor([index % 2 for index in indices])
                    loss = torch.nn.functional.cross_entropy(model(images), labels)
                    optimizer.zero_grad()
                    loss.backward()  # type: ignore[no-untyped-call,unused-ignore]
                    optimizer.step()
                    losses.append(loss.item())
                print(f"epoch {epoch}: mean loss {np.mean(losses):.3f}")


if __name__ == "__main__":
    main()
