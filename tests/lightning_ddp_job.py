"""A job that tests/test_lightning.py runs under Lightning's ``Trainer(strategy="ddp")`` on 2
CPU processes, with the loader built before ``fit`` (Lightning's launcher starts the second
process as this script again; neither has ``RANK`` set, and the process group starts inside
``fit``). Each rank writes the items it trained on, epoch by epoch, to
``{out}/rank-{rank}.json``. ``--shards FOLDER`` reads the tar shards there (4 shards of 4; a
sample's ``cls`` is its item) through ``TarShards`` instead of a map-style dataset.
``--stop-after K`` stops after K steps with a checkpoint (in ``{out}/saved``); ``--resume
CHECKPOINT`` resumes from one.
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
from pytorch_lightning.callbacks import ModelCheckpoint

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

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        while len(self.seen) <= self.current_epoch:  # a run resumed inside an epoch too
            self.seen.append([])
        self.seen[self.current_epoch] += [int(value) for value in batch.flatten()]
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
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--resume", type=Path)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # Lightning's advice and torch's deprecations
    if args.shards is None:
        loader = DataLoader(Items(), batch_size=2, shuffle=True)
    else:
        names = sorted(path.name for path in args.shards.iterdir())
        shards = TarShards(
            FileDataset(names, root=args.shards),
            shuffle=True,
            shuffle_buffer=4,
            length=ITEMS // 2,  # each rank's: a len() that the Trainer resumes exactly by
        )
        loader = DataLoader(shards, batch_size=2, transform=label)
    stop: dict[str, Any] = {"enable_checkpointing": False}
    if args.stop_after is not None:
        saved = ModelCheckpoint(args.out / "saved", every_n_train_steps=args.stop_after)
        stop = {"max_steps": args.stop_after, "callbacks": [saved]}
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
        **stop,
    )
    trainer.fit(Recorded(args.out), train_dataloaders=loader, ckpt_path=args.resume)
    # Lightning leaves the process group up, and the interpreter's exit then aborted now and
    # then ("terminate called without an active exception", in C++ code, no Python thread
    # left but the main one): 1 run of 40, and 2 of 60 with torch's own loader in its place.
    # torch's docs ask for this call at exit.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
