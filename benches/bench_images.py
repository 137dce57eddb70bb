"""The image pipeline against torch DataLoader(num_workers=2) and against the machine's limit.

5,000 JPEGs of 320x240 (made here, in memory): Decode -> RandomResizedCrop(224) ->
RandomHorizontalFlip -> ToFloat -> Normalize -> ToCHW -> ImageCollator, batch 64, 2 CPU
threads. torch runs the same chain (the same code: torchvision cannot be installed beside this
machine's torch wheel) in 2 worker processes, each item made a tensor and stacked by torch's
default collation into shared memory (its fastest setting here). The limit is 2 x the rate of
the same chain run in a plain loop on one core. Then the collation of a 64x3x224x224 float32
batch with and without buffer reuse.

Run: ``.venv/bin/python benches/bench_images.py [--images N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import functools
import io
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from asyncloader import DataLoader, ImageCollator
from asyncloader.transforms import (
    Compose,
    Decode,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHW,
    ToFloat,
)

from _common import interleave, median, save, table

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def chain() -> Compose:
    return Compose(
        [
            Decode(),
            RandomResizedCrop(224),
            RandomHorizontalFlip(),
            ToFloat(),
            Normalize(MEAN, STD),
            ToCHW(),
        ]
    )


def make_jpegs(count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:240, 0:320]
    out = []
    for index in range(count):
        base = np.stack([(x + index) % 256, (y * 2 + index) % 256, (x + y) % 256], -1)
        noisy = np.clip(base + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(noisy).save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


class Jpegs:
    """A map-style dataset of encoded JPEGs held in memory."""

    def __init__(self, items: list[bytes]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> bytes:
        return self.items[index]


class TorchJpegs(Jpegs):
    """The same chain inside a torch dataset: each item a tensor, for torch's collation."""

    def __init__(self, items: list[bytes]) -> None:
        super().__init__(items)
        self.transform = chain()

    def __getitem__(self, index: int) -> Any:
        image = self.transform(index, self.items[index])
        return torch.from_numpy(np.ascontiguousarray(image))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    jpegs = make_jpegs(args.images)
    loader = DataLoader(
        Jpegs(jpegs),
        batch_size=64,
        transform=chain(),
        collate_fn=ImageCollator(buffers=4),
        num_workers=2,
        item_concurrency=2,
        cpu_threads=2,
    )

    def ours() -> float:
        started = time.perf_counter()
        count = sum(len(batch) for batch in loader)
        return count / (time.perf_counter() - started)

    def theirs() -> float:
        started = time.perf_counter()
        torch_loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
            TorchJpegs(jpegs),  # type: ignore[arg-type,unused-ignore]
            batch_size=64,
            num_workers=2,
        )
        count = sum(len(batch) for batch in torch_loader)
        return count / (time.perf_counter() - started)

    def one_core() -> float:
        transform = chain()
        sample = jpegs[:500]
        started = time.perf_counter()
        for index, item in enumerate(sample):
            transform(index, item)
        return len(sample) / (time.perf_counter() - started)

    with loader:
        ours()  # warm-up: threads started, buffers allocated
        figures = interleave(
            {
                "asyncloader (2 CPU threads)": ours,
                "torch DataLoader num_workers=2": theirs,
                "the chain on one core": one_core,
            },
            args.repeats,
        )
    medians = {name: median(values) for name, values in figures.items()}
    limit = 2 * medians["the chain on one core"]
    ours_median = medians["asyncloader (2 CPU threads)"]
    print(f"\n### {args.images} JPEGs 320x240, augmentation chain, batch 64 (images/s)\n")
    print(table([(name, value, "") for name, value in medians.items()]))
    ratios = {
        "vs_torch_2": ours_median / medians["torch DataLoader num_workers=2"],
        "of_limit": ours_median / limit,
    }
    print(
        f"\nlimit (2 x one core): {limit:,.0f}/s; "
        + ", ".join(f"{k}: {v:.2f}" for k, v in ratios.items())
    )

    # Throughput against CPU threads (the same chain; 1 thread is the one-core baseline).
    def with_threads(threads: int) -> float:
        sweep = DataLoader(
            Jpegs(jpegs[:1000]),
            batch_size=64,
            transform=chain(),
            collate_fn=ImageCollator(buffers=4),
            num_workers=2,
            item_concurrency=2,
            cpu_threads=threads,
        )
        with sweep:
            sum(len(batch) for batch in sweep)  # warm
            started = time.perf_counter()
            count = sum(len(batch) for batch in sweep)
            return count / (time.perf_counter() - started)

    sweep_systems: dict[str, Callable[[], float]] = {
        str(threads): functools.partial(with_threads, threads) for threads in (1, 2, 4)
    }
    threads_figures = interleave(sweep_systems, args.repeats)
    threads_medians = {threads: median(values) for threads, values in threads_figures.items()}
    print("\n### asyncloader images/s against cpu_threads\n")
    for threads, value in threads_medians.items():
        print(f"- cpu_threads={threads}: {value:,.0f} images/s")

    items = [np.random.default_rng(i).random((224, 224, 3), dtype=np.float32) for i in range(64)]
    chw = [ToCHW()(0, item) for item in items]

    def collate_with(buffers: int) -> float:
        collate = ImageCollator(buffers=buffers)
        collate(chw)  # warm
        started = time.perf_counter()
        for _ in range(20):
            batch = collate(chw)
            del batch
        return (time.perf_counter() - started) / 20 * 1000

    collation = interleave(
        {
            "fresh memory (buffers=0)": lambda: collate_with(0),
            "reused (buffers=2)": lambda: collate_with(2),
        },
        args.repeats,
    )
    collation_medians = {name: median(values) for name, values in collation.items()}
    print("\n### Collating 64x3x224x224 float32 (ms per batch)\n")
    for name, value in collation_medians.items():
        print(f"- {name}: {value:.2f} ms")
    path = save(
        "images",
        {
            "images": args.images,
            "images_per_s": figures,
            "medians": medians,
            "limit": limit,
            **ratios,
            "images_per_s_by_cpu_threads": threads_figures,
            "medians_by_cpu_threads": threads_medians,
            "collate_ms": collation,
            "collate_medians_ms": collation_medians,
        },
    )
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
