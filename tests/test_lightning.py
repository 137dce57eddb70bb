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


@pytest.mark.parametrize("every", [3, 5])
def test_a_checkpoint_at_the_end_of_an_epoch_cut_by_limit_train_batches_resumes_exactly(
    tmp_path: pathlib.Path, every: int
) -> None:
    # limit_train_batches=5 of 13: the Trainer ends the epoch after 5 batches and the next
    # begins with a new iterator, a new epoch. The state saved after the 5th batch is epoch
    # 0 with 5 received; the resumed run loaded it and trained its second epoch on the rest
    # of the loader's first (batches 5-9) where the uninterrupted run began its second. The
    # Trainer calls set_epoch on the loader's sampler before each epoch: it now numbers the
    # loader's epochs, and a loaded state of another epoch is left unused.
    settings: dict[str, Any] = {"max_epochs": 3, "limit_train_batches": 5}
    whole = fit(tmp_path / "whole", enable_checkpointing=False, **settings)
    saved = ModelCheckpoint(dirpath=tmp_path / "saved", every_n_train_steps=every, save_top_k=-1)
    first = fit(tmp_path / "first", max_steps=every, callbacks=[saved], **settings)
    (checkpoint,) = (tmp_path / "saved").iterdir()
    rest = fit(tmp_path / "rest", ckpt_path=checkpoint, **settings)
    assert len(whole) == 15
    assert first + rest == whole


def test_the_default_checkpoint_at_an_epochs_end_resumes_a_plain_loader_exactly(
    tmp_path: pathlib.Path,
) -> None:
    # From a checkpoint of an epoch's end the Trainer loads no state of the loader, and the
    # loader ran its first epoch again; the Trainer's set_epoch on its sampler now says
    # which epoch runs, with no data module to keep the loader's state.
    whole = fit(tmp_path / "whole", max_epochs=3, enable_checkpointing=False)
    first = fit(tmp_path / "first", max_epochs=1)  # its ModelCheckpoint saves at the end
    (checkpoint,) = (tmp_path / "first").rglob("*.ckpt")
    rest = fit(tmp_path / "rest", checkpoint, max_epochs=3)
    assert len(rest) == 2 * BATCHES
    assert first + rest == whole


class Validated(Recorded):
    """Records the items of every validation batch too."""

    def __init__(self) -> None:
        super().__init__()
        self.validated: list[list[int]] = []

    def validation_step(self, batch: Any, index: int) -> None:
        self.validated.append([int(value) for value in batch.flatten()])


def test_a_shuffled_validation_loader_resumes_in_the_trainers_epoch(
    tmp_path: pathlib.Path,
) -> None:
    # The Trainer saves no state of a validation loader; it calls set_epoch on its sampler
    # with the training epoch, which the loader now takes. Resumed at an epoch's end, the
    # validation loader began again from its own epoch 0, in another order.
    def run(root: pathlib.Path, ckpt_path: pathlib.Path | None = None, **settings: Any) -> Any:
        module = Validated()
        trainer = pl.Trainer(
            default_root_dir=root,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
            num_sanity_val_steps=0,
            **settings,
        )
        validation = DataLoader(Items(), batch_size=25, shuffle=True, seed=9)
        trainer.fit(module, loader(), validation, ckpt_path=ckpt_path)
        return module.validated

    whole = run(tmp_path / "whole", max_epochs=3, enable_checkpointing=False)
    first = run(tmp_path / "first", max_epochs=1)
    (checkpoint,) = (tmp_path / "first").rglob("*.ckpt")
    rest = run(tmp_path / "rest", checkpoint, max_epochs=3)
    assert whole[:4] != whole[4:8]  # each epoch's validation in an order of its own
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


def write_shards(folder: pathlib.Path, per_shard: int = 25) -> list[str]:
    """Items ``0`` to ``4 * per_shard - 1`` as four tar shards (a ``cls`` each)."""
    names = []
    for shard in range(4):
        names.append(f"shard-{shard}.tar")
        with tarfile.open(folder / names[-1], "w") as archive:
            for item in range(shard * per_shard, shard * per_shard + per_shard):
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


DDP_JOB = pathlib.Path(__file__).with_name("lightning_ddp_job.py")


def ddp_run(out: pathlib.Path, kind: str, *args: str) -> list[list[list[int]]]:
    """What each of the 2 ranks of a run of the DDP job in ``out`` trained on, by epoch
    (16 items; in 4 tar shards for ``kind="tar"``)."""
    out.mkdir()
    command = [sys.executable, str(DDP_JOB), "--out", str(out), *args]
    if kind == "tar":
        (out / "shards").mkdir()
        write_shards(out / "shards", per_shard=4)
        command += ["--shards", str(out / "shards")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=out)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["map", "tar"])
def test_ranks_that_lightning_starts_read_their_shares_and_resume_exactly(
    tmp_path: pathlib.Path, kind: str
) -> None:
    # 1. The loader is built before fit(), as `trainer.fit(model, loader)` has it: its ranks
    # were read then, when neither the process group nor RANK existed, and so were (0, 1) for
    # good. Each of the 2 processes Lightning starts trained on every item, every epoch
    # (Lightning gives torch's own loader a DistributedSampler; ours it leaves as it is).
    whole = ddp_run(tmp_path / "whole", kind)
    for epoch in (0, 1):
        zero, one = whole[0][epoch], whole[1][epoch]
        assert not set(zero) & set(one), (epoch, zero, one)
        assert sorted(zero + one) == list(range(16)), (epoch, zero, one)
    assert whole[0][0] != whole[0][1]  # each epoch in an order of its own
    # 2. Lightning saves rank 0's state of the loader alone, and every rank loads it. Ranks
    # of a map-style loader move in lockstep, so it puts each rank where it was; a stream's
    # state is of rank 0's share, which rank 1 refused ("TarShards state ... differs"), and
    # its Trainer failed: it now reads its own share again up to the same batch.
    first = ddp_run(tmp_path / "first", kind, "--stop-after", "3")
    (checkpoint,) = (tmp_path / "first" / "saved").iterdir()
    rest = ddp_run(tmp_path / "rest", kind, "--resume", str(checkpoint))
    for rank in (0, 1):
        assert len(first[rank][0]) == 6
        assert first[rank][0] + rest[rank][0] == whole[rank][0]
        assert rest[rank][1] == whole[rank][1]
