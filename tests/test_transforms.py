"""Each image transform against Pillow + NumPy references (torchvision cannot be installed
beside this machine's torch wheel), the wrong-order errors, bombs, reproducibility."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from typing import Any

import numpy as np
import pytest
from PIL import Image

from asyncloader import Compose, DataLoader
from asyncloader.transforms import (
    CenterCrop,
    Decode,
    HFlip,
    ImageCollator,
    Normalize,
    Pad,
    PadTo,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToCHW,
    ToFloat,
    ToGray,
    ToRGB,
    VFlip,
)
from asyncloader.transforms._geometry import resized_crop_box
from asyncloader.transforms._image import generator

from .images import EncodedImages, encode, picture

IMAGE = picture()


def pil_array(pil: Image.Image) -> np.ndarray[Any, Any]:
    array = np.asarray(pil)
    return array if array.ndim == 3 else array[:, :, None]


@pytest.mark.parametrize(
    ("fmt", "mode", "channels"),
    [
        ("JPEG", "RGB", 3),
        ("JPEG", "L", 1),
        ("PNG", "RGB", 3),
        ("PNG", "L", 1),
        ("PNG", "RGBA", 4),
        ("PNG", "P", 3),
        ("WEBP", "RGB", 3),
    ],
)
def test_decode_matches_pillow(fmt: str, mode: str, channels: int) -> None:
    options = {"lossless": True} if fmt == "WEBP" else {}
    data = encode(IMAGE, fmt, mode, **options)
    decoded = Decode()(0, data)
    reference: Image.Image = Image.open(io.BytesIO(data))
    if reference.mode == "P":
        reference = reference.convert("RGB")
    assert decoded.dtype == np.uint8
    assert decoded.shape == (*IMAGE.shape[:2], channels)
    # Same decoder library underneath (libjpeg-turbo): identical pixels.
    assert np.array_equal(decoded, pil_array(reference))
    # Any bytes-like item: memoryview, bytearray, a NumPy byte array.
    assert np.array_equal(Decode()(0, np.frombuffer(data, np.uint8)), decoded)


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height``: a bomb needs nothing more."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def test_decode_refuses_bombs_and_oversized_items() -> None:
    with pytest.raises(ValueError, match="pixels"):
        Decode()(7, _png_header(100_000, 100_000))  # 10^10 pixels, refused by default
    with pytest.raises(ValueError, match="over max_pixels=1000"):
        Decode(max_pixels=1000)(0, encode(IMAGE, "JPEG"))
    with pytest.raises(ValueError, match="over max_pixels=1000"):
        Decode(max_pixels=1000)(0, encode(IMAGE, "PNG"))
    with pytest.raises(ValueError, match="over max_bytes=100"):
        Decode(max_bytes=100)(0, encode(IMAGE, "PNG"))
    with pytest.raises(ValueError, match=r"cannot be decoded|not a valid JPEG"):
        Decode()(0, b"\xff\xd8\xff garbage")
    with pytest.raises(ValueError, match="cannot be decoded"):
        Decode()(0, b"not an image")


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_resize_matches_pillow(interpolation: str) -> None:
    resample = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
    pil = Image.fromarray(IMAGE)
    exact = Resize((30, 50), interpolation)(0, IMAGE)
    assert np.array_equal(exact, np.asarray(pil.resize((50, 30), resample[interpolation])))
    shorter = Resize(24, interpolation)(0, IMAGE)  # 60x80: the shorter side 60 becomes 24
    assert shorter.shape == (24, 32, 3)
    assert np.array_equal(shorter, np.asarray(pil.resize((32, 24), resample[interpolation])))
    gray = Resize(12)(0, IMAGE[:, :, :1])
    assert gray.shape == (12, 16, 1)


def test_crops_pads_and_flips_match_pillow() -> None:
    pil = Image.fromarray(IMAGE)
    # CenterCrop: torchvision's offsets, int(round((h - th) / 2)).
    assert np.array_equal(CenterCrop((20, 30))(0, IMAGE), np.asarray(pil.crop((25, 20, 55, 40))))
    # Larger than the image: zero-padded around, as torchvision does.
    padded = CenterCrop((64, 82))(0, IMAGE)
    assert padded.shape == (64, 82, 3)
    assert np.array_equal(padded[2:62, 1:81], IMAGE)
    assert not padded[:2].any()
    assert not padded[:, :1].any()
    assert np.array_equal(
        HFlip()(0, IMAGE), np.asarray(pil.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    )
    assert np.array_equal(
        VFlip()(0, IMAGE), np.asarray(pil.transpose(Image.Transpose.FLIP_TOP_BOTTOM))
    )
    framed = Pad((1, 2, 3, 4), fill=7)(0, IMAGE)
    assert framed.shape == (60 + 2 + 4, 80 + 1 + 3, 3)
    assert np.array_equal(framed[2:62, 1:81], IMAGE)
    assert (framed[:2] == 7).all()
    assert Pad(2)(0, IMAGE).shape == (64, 84, 3)
    assert Pad((1, 2))(0, IMAGE).shape == (64, 82, 3)
    to = PadTo(64, 100)(0, IMAGE)
    assert to.shape == (64, 100, 3)
    assert np.array_equal(to[:60, :80], IMAGE)
    with pytest.raises(ValueError, match="larger"):
        PadTo(10, 10)(0, IMAGE)


def test_random_crops_match_pillow_for_the_drawn_box() -> None:
    crop = RandomResizedCrop(32)(5, IMAGE)
    top, left, h, w = resized_crop_box(generator(5, 0x5EED02), 60, 80, (0.08, 1.0), (3 / 4, 4 / 3))
    box = Image.fromarray(IMAGE).crop((left, top, left + w, top + h))
    assert np.array_equal(crop, np.asarray(box.resize((32, 32), Image.Resampling.BILINEAR)))
    assert np.array_equal(RandomResizedCrop(32)(5, IMAGE), crop)  # the same item, the same draw
    cut = RandomCrop((20, 30))(3, IMAGE)
    assert cut.shape == (20, 30, 3)
    found = [
        (r, c)
        for r in range(41)
        for c in range(51)
        if np.array_equal(IMAGE[r : r + 20, c : c + 30], cut)
    ]
    assert len(found) >= 1
    flips = {
        bool(np.array_equal(RandomHorizontalFlip()(i, IMAGE), IMAGE[:, ::-1])) for i in range(40)
    }
    assert flips == {True, False}
    assert np.array_equal(RandomHorizontalFlip(p=0.0)(0, IMAGE), IMAGE)


def test_float_normalize_chw_and_colour_match_numpy_and_pillow() -> None:
    as_float = ToFloat()(0, IMAGE)
    assert as_float.dtype == np.float32
    assert np.array_equal(as_float, IMAGE.astype(np.float32) / 255)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    normal = Normalize(mean, std)(0, as_float)
    expected = (IMAGE.astype(np.float64) / 255 - np.array(mean)) / np.array(std)
    assert np.abs(normal - expected).max() < 1e-5
    chw = ToCHW()(0, normal)
    assert chw.shape == (3, 60, 80)
    assert np.array_equal(np.asarray(chw), np.asarray(normal).transpose(2, 0, 1))
    chw_normal = Normalize(mean, std)(0, ToCHW()(0, as_float))
    assert np.abs(np.asarray(chw_normal) - expected.transpose(2, 0, 1)).max() < 1e-5
    pil = Image.fromarray(IMAGE)
    assert np.array_equal(ToGray()(0, IMAGE), pil_array(pil.convert("L")))
    assert np.array_equal(
        ToRGB()(0, ToGray()(0, IMAGE)), pil_array(pil.convert("L").convert("RGB"))
    )
    rgba = pil_array(pil.convert("RGBA"))
    assert np.array_equal(ToRGB()(0, rgba), IMAGE)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([Decode(), ToFloat(), Decode()], "Decode takes encoded bytes, got a HWC float32"),
        ([Decode(), Normalize([0.5] * 3, [0.5] * 3)], "Normalize takes a float image"),
        ([Decode(), ToCHW(), ToCHW()], "ToCHW takes a HWC image .* got a CHW"),
        ([Decode(), ToFloat(), Resize(10)], "Resize takes a HWC uint8 image"),
        ([Decode(), ToCHW(), CenterCrop(8)], "CenterCrop takes a HWC uint8 image"),
        ([Resize(10)], "Resize takes a HWC uint8 image .* got a bytes"),
    ],
)
def test_a_step_given_what_it_cannot_take_fails_its_item(steps: list[Any], message: str) -> None:
    with DataLoader(
        EncodedImages(4), batch_size=2, transform=Compose(steps), num_workers=1
    ) as loader:
        iterator = iter(loader)
        with pytest.raises(TypeError, match=message):
            next(iterator)
        with pytest.raises(TypeError, match=message):  # and the next batch likewise
            next(iterator)


AUGMENT = Compose(
    [
        Decode(),
        RandomResizedCrop(24),
        RandomHorizontalFlip(),
        ToFloat(),
        Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]),
        ToCHW(),
    ]
)


def _epochs(**settings: Any) -> list[list[np.ndarray[Any, Any]]]:
    with DataLoader(
        EncodedImages(24),
        batch_size=6,
        seed=11,
        transform=AUGMENT,
        collate_fn=ImageCollator(buffers=0),
        **settings,
    ) as loader:
        return [[batch.copy() for batch in loader] for _ in range(2)]


def test_augmentation_is_bit_identical_whatever_the_settings() -> None:
    reference = _epochs()
    for settings in (
        {"num_workers": 2, "item_concurrency": 3},
        {"num_workers": 4, "cpu_threads": 1},
        {"num_workers": 1, "item_concurrency": 6, "cpu_threads": 2},
    ):
        other = _epochs(**settings)
        for a, b in zip(reference, other, strict=True):
            for x, y in zip(a, b, strict=True):
                assert np.array_equal(x, y), settings
    # Each epoch draws anew, reproducibly.
    assert not np.array_equal(reference[0][0], reference[1][0])


async def test_async_for_gives_the_same_augmentation() -> None:
    reference = _epochs(num_workers=2)
    async with DataLoader(
        EncodedImages(24),
        batch_size=6,
        seed=11,
        transform=AUGMENT,
        collate_fn=ImageCollator(buffers=0),
        num_workers=3,
        item_concurrency=2,
    ) as loader:
        first = [batch.copy() async for batch in loader]
    assert all(np.array_equal(x, y) for x, y in zip(reference[0], first, strict=True))


def test_shuffled_epochs_augment_each_index_the_same_way() -> None:
    def by_index(**settings: Any) -> dict[int, np.ndarray[Any, Any]]:
        with DataLoader(
            EncodedImages(12), batch_size=4, seed=3, transform=AUGMENT, collate_fn=list, **settings
        ) as loader:
            return {
                i: np.asarray(x)
                for idx, b in loader.iter_with_indices()
                for i, x in zip(idx, b, strict=True)
            }

    plain, shuffled = by_index(), by_index(shuffle=True, num_workers=2)
    assert all(np.array_equal(plain[i], shuffled[i]) for i in range(12))


def test_a_built_chain_imports_nothing_when_it_runs(tmp_path: Any) -> None:
    """Pillow (with its common formats) and numpy.random are imported when the steps are
    built, not by the first item on a CPU thread: an import there holds the GIL for
    milliseconds inside the first batch."""
    image = tmp_path / "image.png"
    image.write_bytes(encode(picture(40, 60), "PNG"))
    script = f"""
import sys
from asyncloader.transforms import Compose, Decode, RandomHorizontalFlip, RandomResizedCrop
chain = Compose([Decode(), RandomResizedCrop(24), RandomHorizontalFlip()])
before = set(sys.modules)
with open({str(image)!r}, "rb") as file:
    assert chain(0, file.read()).shape == (24, 24, 3)
print(sorted(set(sys.modules) - before))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_an_empty_image_fails_resizing_steps_saying_so() -> None:
    # A 0x5 image made Resize and RandomResizedCrop divide by zero (ZeroDivisionError).
    for shape in ((0, 5, 3), (5, 0, 3)):
        empty = np.zeros(shape, np.uint8)
        for step in (Resize(8), RandomResizedCrop(6)):
            with pytest.raises(ValueError, match="an empty image"):
                step(0, empty)


@pytest.mark.parametrize(
    ("step", "settings", "named"),
    [
        (Pad, {"padding": 2, "fill": 256}, "fill"),
        (Pad, {"padding": 2, "fill": -1}, "fill"),
        (Pad, {"padding": 2, "fill": 1.5}, "fill"),
        (Pad, {"padding": 2, "fill": "x"}, "fill"),
        (Pad, {"padding": True}, "padding"),
        (PadTo, {"height": 10, "width": 10, "fill": 300}, "fill"),
        (RandomResizedCrop, {"size": 4, "ratio": (1.0, float("inf"))}, "ratio"),
        (RandomResizedCrop, {"size": 4, "scale": (0.5, float("inf"))}, "scale"),
        (RandomResizedCrop, {"size": 4, "scale": "ab"}, "scale"),
        (RandomResizedCrop, {"size": 4, "ratio": (1.0, 2.0, 3.0)}, "ratio"),
        (RandomResizedCrop, {"size": 4, "salt": 1.5}, "salt"),
        (RandomCrop, {"size": 4, "salt": "x"}, "salt"),
        (RandomHorizontalFlip, {"salt": None}, "salt"),
        (RandomHorizontalFlip, {"p": "0.5"}, "p"),
        (Normalize, {"mean": [float("nan")] * 3, "std": [1.0] * 3}, "mean"),
        (Normalize, {"mean": [0.0] * 3, "std": [float("inf")] * 3}, "std"),
        (ImageCollator, {"mean": [0.5] * 3, "std": [float("nan")] * 3}, "std"),
        (ImageCollator, {"buffers": True}, "buffers"),
    ],
)
def test_a_step_refuses_a_setting_that_would_fail_or_spoil_every_item(
    step: Any, settings: dict[str, Any], named: str
) -> None:
    # Each was accepted, and then every item failed (a fill out of uint8's range, an infinite
    # ratio, a salt that seeds nothing), or came out NaN or zero (a NaN mean, an infinite
    # std), or was taken as another value (a fill of 1.5 as 1, padding=True as 1).
    with pytest.raises(ValueError, match=rf"{step.__name__}: {named}\b"):
        step(**settings)


def test_a_huge_finite_ratio_falls_back_to_a_central_crop() -> None:
    # A crop's area times a ratio near float's largest overflowed to inf (OverflowError),
    # and the fallback's crop of such a ratio was 0 pixels high (an empty image).
    # Now every draw is passed over and the fallback is the image's widest 1-pixel strip.
    box = resized_crop_box(generator(0, 1), 30, 40, (0.5, 1.0), (1e307, 1e308))
    assert box == (14, 0, 1, 40)
