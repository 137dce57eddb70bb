"""A job that tests/test_lightning.py runs under Lightning's ``Trainer(strategy="ddp")`` on 2
CPU processes, with the loader built before ``fit`` (Lightning's launcher starts the second
process as this script again; neither has ``RANK`` set, and the process group starts inside
``fit``). Each rank writes the items it trained on, epoch by epoch, to
``{out}/rank-{rank}.json``. ``--shards FOLDER`` reads the tar shards there (a sample's ``cls``
is its item) through ``TarShards`` instead of a map-style dataset.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from asyncloader import DataLoader, FileDataset, TarShards

ITEMS = 16


class Items:
    """Item ``i`` is ``[i]``."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        return np.array([index], dtype=np.float32)


def label(index: int, sample: dict[str, Any]) -> np.ndarray[Any, Any]:
    return np.array([int(sample["cls"])], dtype=np.float32)


class Recorded(pl.LightningModule):  # type: ignore[misc,unused-ignore]
    """Records the items it trains on, epoch by epoch, and writes them at the end."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out = out
        self.seen: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        self.seen[-1] += [int(value) for value in batch.flatten()]
        loss: torch.Tensor = self.layer(torch.as_tensor(batch)).sum()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def on_train_end(self) -> None:
        (self.out / f"rank-{self.global_rank}.json").write_text(json.dumps(self.seen))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shards", type=Path)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # Lightning's advice and torch's deprecations
    if args.shards is None:
        loader = DataLoader(Items(), batch_size=2, shuffle=True)
    else:
        names = sorted(path.name for path in args.shards.iterdir())
        shards = TarShards(FileDataset(names, root=args.shards), shuffle=True, shuffle_buffer=4)
        loader = DataLoader(shards, batch_size=2, transform=label)
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
    )
    trainer.fit(Recorded(args.out), train_dataloaders=loader)


if __name__ == "__main__":
    main()
