"""The image workload's pieces, and the measurement behind the collator's buffer reuse.

``crop_chain()``, ``normalizing_collator()``, ``chain()``, ``make_jpegs()``, ``Jpegs`` and
``TorchJpegs`` are the JPEG workload of the suite (``suite.py`` (c): 320x240 JPEGs, Decode ->
RandomResizedCrop(224) -> RandomHorizontalFlip, then ToFloat -> Normalize -> ToCHW, either
while collating (``ImageCollator(mean=..., std=...)``) or per item (torch runs the same code
per item, as torchvision cannot be installed beside this machine's torch wheel). Run as a
script, it times the collation of a 64x3x224x224 float32 batch into fresh memory and into
reused buffers, and how the chain with its normalizing collation scales over two threads
and over two processes (no GIL between them), without a loader: what bounds (c).

Run: ``.venv/bin/python benches/bench_images.py [--repeats R]``.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from PIL import Image

from asyncloader import ImageCollator
from asyncloader.transforms import (
    Compose,
    Decode,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHW,
    ToFloat,
)

from _common import interleave, median, save, timed

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def crop_chain() -> Compose:
    """The chain up to uint8: the loaders that collate with :func:`normalizing_collator`."""
    return Compose([Decode(), RandomResizedCrop(224), RandomHorizontalFlip()])


def normalizing_collator() -> ImageCollator:
    """Normalizes while it collates: with :func:`crop_chain`, the batches of :func:`chain`."""
    return ImageCollator(buffers=4, mean=MEAN, std=STD)


def chain() -> Compose:
    """The whole chain per item (torch's way: each item a normalized float tensor)."""
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
        import torch  # here, not at the top: see bench_gil's docstring

        image = self.transform(index, self.items[index])
        return torch.from_numpy(np.ascontiguousarray(image))


def crop_and_collate(jpegs: list[bytes], start: int, stop: int) -> int:
    """The suite's (c) on ``jpegs[start:stop]``, batch 64, in the calling thread."""
    transform, collate = crop_chain(), normalizing_collator()
    for first in range(start, stop, 64):
        collate([transform(i, jpegs[i]) for i in range(first, min(first + 64, stop))])
    return stop - start


_JPEGS: list[bytes] = []
"""The images, set before the processes fork so that each inherits them."""


def _half(bounds: tuple[int, int]) -> int:
    return crop_and_collate(_JPEGS, *bounds)


def _halves(count: int) -> list[tuple[int, int]]:
    return [(0, count // 2), (count // 2, count)]


@contextmanager
def two_processes(jpegs: list[bytes]) -> Iterator[Callable[[], int]]:
    """Two forked processes, started and warm; yields a function that runs (c) on half of
    ``jpegs`` in each and returns how many it ran: what two cores give with no GIL."""
    _JPEGS[:] = jpegs
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_half, [(0, 64), (64, 128)])
        yield lambda: sum(pool.map(_half, _halves(len(jpegs))))


def scaling(repeats: int) -> dict[str, list[float]]:
    """Images/s of (c)'s chain and collation: one thread, two threads, two processes."""
    jpegs = make_jpegs(1000)
    count = len(jpegs)

    def two_threads() -> int:
        threads = [
            threading.Thread(target=crop_and_collate, args=(jpegs, *half))
            for half in _halves(count)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return count

    with two_processes(jpegs) as in_processes:
        return interleave(
            {
                "one thread": lambda: timed(lambda: crop_and_collate(jpegs, 0, count)),
                "two threads": lambda: timed(two_threads),
                "two processes": lambda: timed(in_processes),
            },
            repeats,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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
    rates = scaling(args.repeats)
    rate_medians = {name: median(values) for name, values in rates.items()}
    print("\n### Crop chain and normalizing collation, no loader (images/s)\n")
    for name, value in rate_medians.items():
        print(f"- {name}: {value:,.0f} ({value / 2 / rate_medians['one thread']:.2f} of 2x one)")
    path = save(
        "images",
        {
            "collate_ms": collation,
            "collate_medians_ms": collation_medians,
            "scaling_per_s": rates,
            "scaling_medians_per_s": rate_medians,
        },
    )
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
