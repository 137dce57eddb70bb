"""Mutated real images through ``Decode``; run as a child process by the tests.

Usage: ``python -m tests.fuzz_decode CASES SEED``. Each case takes a real JPEG, PNG (8-bit
colour, 16-bit gray, palette) or WebP and mutates it (bytes flipped, cut short, a stretch
repeated, its header's size made huge with the checksum mended). The only outcomes allowed are
an image within the limits or a ``ValueError`` from ``Decode``; anything else is printed and
counted. The last line is a JSON summary with the peak RSS.
"""

from __future__ import annotations

import io
import json
import random
import struct
import sys
import warnings
import zlib
from collections import Counter

import numpy as np
from PIL import Image

from asyncloader.transforms import Decode

MAX_PIXELS = 1 << 20


def seeds() -> dict[str, bytes]:
    """Small real images of each kind Decode documents."""
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    out = {}
    for name, image, fmt in [
        ("jpeg", rgb, "JPEG"),
        ("png", rgb, "PNG"),
        ("png16", Image.fromarray(rng.integers(0, 65535, (40, 30), dtype=np.uint16)), "PNG"),
        ("palette", rgb.convert("P"), "PNG"),
        ("webp", rgb, "WEBP"),
    ]:
        buffer = io.BytesIO()
        image.save(buffer, fmt)
        out[name] = buffer.getvalue()
    return out


def huge_png_header(data: bytes, rng: random.Random) -> bytes:
    """The PNG with its IHDR width and height set large, its CRC mended."""
    start = data.index(b"IHDR")
    body = bytearray(data[start + 4 : start + 17])
    body[0:8] = struct.pack(">II", rng.randint(1, 1 << 20), rng.randint(1 << 12, 1 << 20))
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + bytes(body)))
    return data[: start + 4] + bytes(body) + crc + data[start + 21 :]


def mutate(data: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    buffer = bytearray(data)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            buffer[rng.randrange(len(buffer))] = rng.randrange(256)
    elif kind == 1:
        del buffer[rng.randrange(1, len(buffer)) :]
    elif kind == 2:
        start = rng.randrange(len(buffer))
        stretch = buffer[start : start + rng.randint(1, 64)]
        buffer[start:start] = stretch * rng.randint(1, 50)
    elif data.startswith(b"\x89PNG"):
        return huge_png_header(data, rng)
    return bytes(buffer)


def _peak_rss_kib() -> int:
    """This process's peak RSS. Not ``ru_maxrss``: Linux keeps that across fork and exec, so a
    child of a large process (pytest) would report its parent's peak."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1])


def main() -> int:
    cases, seed = int(sys.argv[1]), int(sys.argv[2])
    warnings.simplefilter("ignore")  # Pillow's own bomb warnings: Decode refuses by itself
    rng = random.Random(seed)
    decode = Decode(max_pixels=MAX_PIXELS)
    outcomes: Counter[str] = Counter()
    bad = 0
    images = list(seeds().items())
    for case in range(cases):
        name, data = images[case % len(images)]
        mutated = mutate(data, rng)
        try:
            image = decode(case, mutated)
        except ValueError:
            outcomes[f"{name} refused"] += 1
            continue
        except Exception as error:  # what the fuzz hunts for
            bad += 1
            print(f"case {case} ({name}): {type(error).__name__}: {error}"[:300])
            continue
        ok = (
            isinstance(image, np.ndarray)
            and image.ndim == 3
            and image.shape[2] in (1, 3, 4)
            and image.dtype in (np.uint8, np.uint16)
            and image.shape[0] * image.shape[1] <= MAX_PIXELS
        )
        if not ok:
            bad += 1
            print(f"case {case} ({name}): an image out of contract {image.shape} {image.dtype}")
        outcomes[f"{name} decoded"] += 1
    peak_mib = _peak_rss_kib() / 1024
    print(json.dumps({"bad": bad, "peak_rss_mib": round(peak_mib), **outcomes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
