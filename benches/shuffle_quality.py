"""How well TarShards mixes an epoch: docs/streaming.md's table (no timing, only order).

64 shards of 1,000 one-byte samples in a temporary folder, ``shuffle=True``, batches of 256;
for each ``interleave`` and ``shuffle_buffer``, the mean number of shards a batch draws from,
and how far a sample lands from where the shards alone (the same ``interleave``, no buffer) put
it. Run: ``.venv/bin/python benches/shuffle_quality.py``.
"""

from __future__ import annotations

import io
import os
import statistics
import tarfile
import tempfile

from asyncloader import DataLoader, FileDataset, TarShards

SHARDS, PER_SHARD, BATCH = 64, 1000, 256


def write_shards(folder: str) -> list[str]:
    names = []
    for shard in range(SHARDS):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as archive:
            for i in range(PER_SHARD):
                info = tarfile.TarInfo(f"{shard:02d}{i:04d}.x")
                info.size = 1
                archive.addfile(info, io.BytesIO(b"x"))
        with open(os.path.join(folder, f"{shard}.tar"), "wb") as file:
            file.write(out.getvalue())
        names.append(f"{shard}.tar")
    return names


def keys(folder: str, names: list[str], interleave: int, buffer: int) -> list[list[str]]:
    shards = FileDataset(names, root=folder)
    data = TarShards(shards, interleave=interleave, shuffle=True, shuffle_buffer=buffer)
    with DataLoader(data, batch_size=BATCH, seed=0, collate_fn=list) as loader:
        return [[sample["__key__"] for sample in batch] for batch in loader]


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        names = write_shards(folder)
        print("| interleave K | shuffle_buffer N | shards in a batch (mean) | mean displacement |")
        print("|---:|---:|---:|---:|")
        for interleave in (1, 4, 16):
            unmixed = [k for batch in keys(folder, names, interleave, 0) for k in batch]
            place = {key: at for at, key in enumerate(unmixed)}
            for buffer in (0, 1000, 10000):
                batches = keys(folder, names, interleave, buffer)
                order = [key for batch in batches for key in batch]
                spread = statistics.mean(len({key[:2] for key in batch}) for batch in batches)
                moved = statistics.mean(abs(at - place[key]) for at, key in enumerate(order))
                print(f"| {interleave} | {buffer:,} | {spread:.1f} | {moved:,.0f} |")


if __name__ == "__main__":
    main()
