"""A data-parallel job that tests/test_torchrun.py runs under ``torchrun`` (gloo backend).

Each rank iterates one epoch of a shuffled dataset through asyncloader, which finds its rank
and world size from ``torch.distributed``. After every batch a rank writes what it received
and the loader's state (as a training job writes its checkpoint). ``--die-after K`` makes
every rank crash after K batches; ``--resume`` starts from the saved state of rank 0. At the
end, rank 0 writes what every rank received (``all_gather_object``). ``--shards FOLDER`` reads
the tar shards there through ``TarShards`` instead (a sample's key is its number), and each
rank resumes from its own saved state (a rank's walk is over its own shards).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist

from asyncloader import DataLoader, FileDataset, TarShards

SAMPLES = 48


class Items:
    """Item ``i`` is ``i``."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> int:
        return index


def write(path: Path, value: object) -> None:
    """Write ``value`` as JSON atomically (a crash never leaves half a file)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--resume-from")
    parser.add_argument("--shards", type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.shards is None:
        loader = DataLoader(Items(), batch_size=4, shuffle=True, seed=7, num_workers=1)
    else:
        names = sorted(path.name for path in args.shards.glob("*.tar"))
        shards = TarShards(
            FileDataset(names, root=args.shards), interleave=2, shuffle=True, shuffle_buffer=5
        )
        loader = DataLoader(
            shards,
            batch_size=4,
            seed=7,
            num_workers=1,
            collate_fn=lambda samples: [int(sample["__key__"]) for sample in samples],
        )
    assert (loader.rank, loader.world_size) == (rank, world), (loader.rank, loader.world_size)
    if args.resume_from:
        saved = 0 if args.shards is None else rank
        state = json.loads((args.out / f"state-{args.resume_from}-{saved}.json").read_text())
        loader.load_state_dict(state)
    received: list[int] = []
    with loader:
        for step, batch in enumerate(loader, start=1):
            received += batch if isinstance(batch, list) else batch.tolist()
            write(args.out / f"received-{args.label}-{rank}.json", received)
            write(args.out / f"state-{args.label}-{rank}.json", loader.state_dict())
            if step == args.die_after:
                dist.barrier()  # every rank has saved this step: now the job "crashes"
                os._exit(3)
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, received)
    if rank == 0:
        write(args.out / f"gathered-{args.label}.json", gathered)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
