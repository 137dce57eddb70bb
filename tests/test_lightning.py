"""A Lightning ``Trainer`` checkpoints the loader and resumes it exactly (pytorch-lightning,
real): from a checkpoint every N steps, the one on an epoch's last batch too, and from the
one its ``ModelCheckpoint`` writes at each epoch's end, the resumed run trains on the batches
the uninterrupted one trained on next; tar shards too, given their length."""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys
import tarfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from asyncloader import DataLoader, FileDataset, TarShards

BATCHES = 13
"""Batches an epoch: 100 items, batch 8."""

pytestmark = [
    # Lightning's advice (more workers, the callbacks to pass again), and its use of a torch
    # API that torch 2.13 deprecates: not the loader's.
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
]


class Items:
    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        return np.array([index], dtype=np.float32)


class Recorded(pl.LightningModule):  # type: ignore[misc,unused-ignore]
    """Records the items of every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        self.seen.append([int(value) for value in batch.flatten()])
        loss: torch.Tensor = self.layer(torch.as_tensor(batch)).sum()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(
    root: pathlib.Path,
    ckpt_path: pathlib.Path | None = None,
    data_module: bool = False,
    make: Callable[[], DataLoader] | None = None,
    **settings: Any,
) -> list[Any]:
    """The batches one ``Trainer.fit`` trained on, over a fresh loader (``make()``, else
    :func:`loader`; in a :class:`Data` with ``data_module``)."""
    module = Recorded()
    trainer = pl.Trainer(
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        **settings,
    )
    if data_module:
        trainer.fit(module, datamodule=Data(), ckpt_path=ckpt_path)
    else:
        trainer.fit(module, (make or loader)(), ckpt_path=ckpt_path)
    return module.seen


def loader() -> DataLoader:
    return DataLoader(Items(), batch_size=8, shuffle=True, seed=3, num_workers=2)


@pytest.mark.parametrize("every", [5, BATCHES, BATCHES + 1])
def test_a_checkpoint_every_n_steps_resumes_exactly(tmp_path: pathlib.Path, every: int) -> None:
    whole = fit(tmp_path / "whole", max_epochs=2, enable_checkpointing=False)
    saved = ModelCheckpoint(dirpath=tmp_path / "saved", every_n_train_steps=every, save_top_k=-1)
    first = fit(tmp_path / "first", max_epochs=2, max_steps=every, callbacks=[saved])
    (checkpoint,) = (tmp_path / "saved").iterdir()
    rest = fit(tmp_path / "rest", ckpt_path=checkpoint, max_epochs=2)
    assert len(first) == every
    assert first + rest == whole


class Data(pl.LightningDataModule):  # type: ignore[misc,unused-ignore]
    """The loader in a data module that keeps its state in every checkpoint, as
    docs/checkpointing.md says: Lightning restores a loader's own state only inside an epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.loader = loader()

    def train_dataloader(self) -> DataLoader:
        return self.loader

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])


def test_the_checkpoint_at_an_epochs_end_resumes_exactly(tmp_path: pathlib.Path) -> None:
    whole = fit(tmp_path / "whole", data_module=True, max_epochs=3, enable_checkpointing=False)
    first = fit(
        tmp_path / "first", data_module=True, max_epochs=1
    )  # its ModelCheckpoint saves at the end
    (checkpoint,) = (tmp_path / "first").rglob("*.ckpt")
    rest = fit(tmp_path / "rest", checkpoint, data_module=True, max_epochs=3)
    assert len(first) == BATCHES
    assert len(rest) == 2 * BATCHES
    assert first + rest == whole
    assert whole[:BATCHES] == fit(tmp_path / "plain", max_epochs=1)  # epoch 0 either way


def test_a_data_module_resumes_exactly_inside_an_epoch_too(tmp_path: pathlib.Path) -> None:
    whole = fit(tmp_path / "whole", data_module=True, max_epochs=2, enable_checkpointing=False)
    saved = ModelCheckpoint(dirpath=tmp_path / "saved", every_n_train_steps=5, save_top_k=-1)
    fit(tmp_path / "first", data_module=True, max_epochs=2, max_steps=5, callbacks=[saved])
    (checkpoint,) = (tmp_path / "saved").iterdir()
    rest = fit(tmp_path / "rest", checkpoint, data_module=True, max_epochs=2)
    assert whole[5:] == rest


def write_shards(folder: pathlib.Path) -> list[str]:
    """The 100 items of :class:`Items` as four tar shards of 25 samples (a ``cls`` each)."""
    names = []
    for shard in range(4):
        names.append(f"shard-{shard}.tar")
        with tarfile.open(folder / names[-1], "w") as archive:
            for item in range(shard * 25, shard * 25 + 25):
                data = str(item).encode()
                info = tarfile.TarInfo(f"{item:03d}.cls")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return names


def label(index: int, sample: dict[str, Any]) -> np.ndarray[Any, Any]:
    return np.array([int(sample["cls"])], dtype=np.float32)


@pytest.mark.parametrize("every", [5, BATCHES])
def test_tar_shards_of_a_given_length_resume_exactly(tmp_path: pathlib.Path, every: int) -> None:
    # With no len() the Trainer reads a batch ahead to find the epoch's end, and the state
    # counts it: `length` gives the stream its len(), and the Trainer reads none ahead.
    names = write_shards(tmp_path)

    def make() -> DataLoader:
        shards = TarShards(
            FileDataset(names, root=tmp_path), shuffle=True, shuffle_buffer=16, length=100
        )
        return DataLoader(shards, batch_size=8, seed=3, transform=label)

    whole = fit(tmp_path / "whole", make=make, max_epochs=2, enable_checkpointing=False)
    saved = ModelCheckpoint(dirpath=tmp_path / "saved", every_n_train_steps=every, save_top_k=-1)
    first = fit(tmp_path / "first", make=make, max_epochs=2, max_steps=every, callbacks=[saved])
    (checkpoint,) = (tmp_path / "saved").iterdir()
    rest = fit(tmp_path / "rest", ckpt_path=checkpoint, make=make, max_epochs=2)
    assert sorted(i for batch in whole[:BATCHES] for i in batch) == list(range(100))
    assert len(whole) == 2 * BATCHES
    assert first + rest == whole


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["map", "tar"])
def test_ranks_that_lightning_starts_after_the_loader_was_built_read_their_shares(
    tmp_path: pathlib.Path, kind: str
) -> None:
    # The loader is built before fit(), as `trainer.fit(model, loader)` has it: its ranks were
    # read then, when neither the process group nor RANK existed, and so were (0, 1) for
    # good. Each of the 2 processes Lightning starts trained on every item, every epoch
    # (Lightning gives torch's own loader a DistributedSampler; ours it leaves as it is).
    job = pathlib.Path(__file__).with_name("lightning_ddp_job.py")
    command = [sys.executable, str(job), "--out", str(tmp_path)]
    items = 16
    if kind == "tar":
        shards = tmp_path / "shards"
        shards.mkdir()
        for shard in range(4):
            with tarfile.open(shards / f"shard-{shard}.tar", "w") as archive:
                for item in range(shard * 4, shard * 4 + 4):
                    data = str(item).encode()
                    info = tarfile.TarInfo(f"{item:03d}.cls")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        command += ["--shards", str(shards)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    for epoch in (0, 1):
        first, second = ranks[0][epoch], ranks[1][epoch]
        assert not set(first) & set(second), (epoch, first, second)
        assert sorted(first + second) == list(range(items)), (epoch, first, second)
    assert ranks[0][0] != ranks[0][1]  # each epoch in an order of its own
