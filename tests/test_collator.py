"""ImageCollator: one copy into one contiguous array, memory reused only when truly free."""

from __future__ import annotations

import gc
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from asyncloader import DataLoader, ImageCollator, Transform
from asyncloader.transforms import (
    Compose,
    Decode,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHW,
    ToFloat,
    ToRGB,
)

from .images import EncodedImages, picture


def images(n: int, value: int | None = None) -> list[np.ndarray[Any, Any]]:
    out = [picture(8, 10, seed=i) for i in range(n)]
    if value is not None:
        out = [np.full_like(image, value) for image in out]
    return out


def address(array: np.ndarray[Any, Any]) -> int:
    return int(array.__array_interface__["data"][0])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_layouts_from_hwc_and_chw_items(layout: str) -> None:
    items = images(3)
    collate = ImageCollator(layout=layout)
    from_hwc = collate(items)
    from_chw = collate([ToCHW()(0, image) for image in items])
    expected = np.stack(items) if layout == "NHWC" else np.stack(items).transpose(0, 3, 1, 2)
    for batch in (from_hwc, from_chw):
        assert batch.flags.c_contiguous
        assert type(batch) is np.ndarray
        assert np.array_equal(batch, expected)
    as_float = ImageCollator(dtype=np.float32)(items)
    assert as_float.dtype == np.float32
    assert np.array_equal(
        as_float, expected if layout == "NCHW" else expected.transpose(0, 3, 1, 2)
    )


def test_the_memory_of_a_dropped_batch_comes_back() -> None:
    collate = ImageCollator(buffers=2)
    first = collate(images(4, 1))
    where = address(first)
    del first
    gc.collect()
    second = collate(images(4, 2))
    assert address(second) == where
    assert collate.reused == 1
    assert (second == 2).all()


def test_a_batch_held_through_a_view_is_never_overwritten() -> None:
    collate = ImageCollator(buffers=2)
    first = collate(images(4, 1))
    view = first[1:, 0]  # only a view survives
    where = address(first)
    del first
    gc.collect()
    second = collate(images(4, 2))
    assert address(second) != where
    assert (view == 1).all()
    del view
    gc.collect()
    third = collate(images(4, 3))
    assert address(third) == where
    assert (second == 2).all()
    assert (third == 3).all()


def test_taking_memory_never_waits_for_a_consumer_that_holds_batches() -> None:
    collate = ImageCollator(buffers=2)
    held = [collate(images(2, value)) for value in range(10)]  # all kept: no buffer is free
    assert len({address(batch) for batch in held}) == 10
    assert all((batch == value).all() for value, batch in enumerate(held))
    del held
    gc.collect()
    assert address(collate(images(2))) is not None
    assert collate.reused == 1  # at most `buffers` were kept


def test_batches_of_a_new_size_are_reused_after_older_sizes() -> None:
    # Batches padded to their largest image change size; the pool kept the first sizes'
    # buffers for good, so once it held `buffers` of them no later size was ever reused.
    collate = ImageCollator(buffers=2)
    for size in (1, 2, 3, 3, 3, 3):
        batch = collate(images(size))
        del batch
        gc.collect()
    assert collate.reused == 3  # each size-3 batch after the first


def test_mixed_shapes_fail_the_batch_naming_both_shapes() -> None:
    collate = ImageCollator()
    with pytest.raises(ValueError, match=r"\(8, 10, 3\).*\(9, 10, 3\)$"):
        collate([picture(8, 10), picture(9, 10)])
    gray = picture(8, 10)[:, :, :1]
    with pytest.raises(ValueError, match=r"\(8, 10, 1\) \(of different channels: add ToRGB"):
        collate([picture(8, 10), gray])
    assert collate([picture(8, 10), ToRGB()(0, gray)]).shape == (2, 3, 8, 10)
    with pytest.raises(TypeError, match="3-D images"):
        collate([b"bytes"])
    with pytest.raises(ValueError, match="layout"):
        ImageCollator(layout="CHW")


def test_mixed_dtypes_fail_the_batch_naming_both() -> None:
    # A uint16 image after a uint8 one (a 16-bit PNG among 8-bit ones) was cast to uint8,
    # wrapping its values, and a float one in [0, 1] to zeros: silently.
    collate = ImageCollator()
    eight = np.full((4, 4, 1), 200, np.uint8)
    for other in (np.full((4, 4, 1), 40000, np.uint16), np.full((4, 4, 1), 0.5, np.float32)):
        with pytest.raises(ValueError, match="different dtypes") as refused:
            collate([eight, other])
        assert "uint8" in str(refused.value)
        assert str(other.dtype) in str(refused.value)
    cast = ImageCollator(dtype=np.float32)([eight, np.full((4, 4, 1), 0.5, np.float32)])
    assert cast.dtype == np.float32  # a dtype asked for: each item is converted to it
    assert float(cast[1].max()) == 0.5


def test_images_of_objects_are_refused_and_nothing_crashes() -> None:
    # An object array collated into pooled memory made an object array over raw bytes: its
    # pointers never counted, and the process died of a segmentation fault at exit.
    code = """
import numpy as np
from asyncloader import ImageCollator
collate = ImageCollator()
for _ in range(20):
    try:
        collate([np.array([object()] * 3).reshape(1, 1, 3)])
        print("collated")
    except TypeError as error:
        print(error)
try:
    ImageCollator(dtype=object)
except ValueError as error:
    print(error)
"""
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr[-2000:]
    lines = child.stdout.splitlines()
    assert (
        lines[:20]
        == ["ImageCollator takes images of numbers, got a HWC object array of shape (1, 1, 3)"] * 20
    )
    assert lines[20] == "ImageCollator: dtype must be a numeric dtype, got dtype('O')"


def test_through_the_loader_with_reuse() -> None:
    transform = Compose([Decode(), ToFloat(), ToCHW()])
    collate = ImageCollator(buffers=4)
    with DataLoader(
        EncodedImages(40), batch_size=8, transform=transform, collate_fn=collate, num_workers=2
    ) as loader:
        for _ in range(3):
            for batch in loader:
                assert batch.shape == (8, 3, 48, 64)
                assert batch.dtype == np.float32
                del batch
    assert collate.reused > 0


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("chw_items", [False, True])
def test_normalizing_while_collating_equals_the_per_item_steps_bit_for_bit(
    layout: str, chw_items: bool
) -> None:
    items = images(4)
    per_item = Compose([ToFloat(), Normalize(MEAN, STD)])
    expected = ImageCollator(layout=layout)([per_item(0, image) for image in items])
    if chw_items:
        items = [ToCHW()(0, image) for image in items]
    fused = ImageCollator(layout=layout, mean=MEAN, std=STD)
    batch = fused(items)
    assert batch.dtype == np.float32
    assert batch.flags.c_contiguous
    assert np.array_equal(batch, expected)
    # float items are normalized only (no division by 255), as Normalize alone does
    floats = [ToFloat()(0, image) for image in items]
    normalized = [Normalize(MEAN, STD)(0, image) for image in floats]
    assert np.array_equal(fused(floats), ImageCollator(layout=layout)(normalized))


def test_normalizing_while_collating_through_the_loader() -> None:
    """A uint8 chain and a normalizing collator give the batches of the float chain."""
    crop: list[Transform] = [Decode(), RandomResizedCrop((32, 40)), RandomHorizontalFlip()]
    settings: dict[str, Any] = {"batch_size": 8, "num_workers": 2, "seed": 3}
    with DataLoader(
        EncodedImages(24),
        transform=Compose([*crop, ToFloat(), Normalize(MEAN, STD), ToCHW()]),
        collate_fn=ImageCollator(),
        **settings,
    ) as loader:
        expected = [batch.copy() for batch in loader]
    collate = ImageCollator(mean=MEAN, std=STD, buffers=2)
    with DataLoader(
        EncodedImages(24), transform=Compose(crop), collate_fn=collate, **settings
    ) as loader:
        got = [batch.copy() for batch in loader]
    assert len(got) == len(expected) == 3
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.shape == (8, 3, 32, 40)
        assert np.array_equal(mine, theirs)


def test_normalizing_settings_and_items_are_checked() -> None:
    with pytest.raises(ValueError, match="both mean and std"):
        ImageCollator(mean=MEAN)
    with pytest.raises(ValueError, match="ImageCollator: std must be finite and not zero"):
        ImageCollator(mean=MEAN, std=[0.2, 0.0, 0.2])
    with pytest.raises(ValueError, match=r"ImageCollator: mean .* equal-length"):
        ImageCollator(mean=MEAN, std=[0.2, 0.2])
    with pytest.raises(ValueError, match="float32, got dtype"):
        ImageCollator(mean=MEAN, std=STD, dtype=np.float16)
    collate = ImageCollator(mean=MEAN, std=STD)
    assert "mean=[0.48" in repr(collate)
    assert "std=[0.22" in repr(collate)
    with pytest.raises(ValueError, match="3 channels' mean and std, the images 1"):
        collate([np.zeros((4, 4, 1), np.uint8)])
    with pytest.raises(TypeError, match="uint8 or float images"):
        collate([np.zeros((4, 4, 3), np.int32)])
