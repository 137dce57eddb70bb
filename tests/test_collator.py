"""ImageCollator: one copy into one contiguous array, memory reused only when truly free."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from asyncloader import DataLoader, ImageCollator
from asyncloader.transforms import Compose, Decode, ToCHW, ToFloat

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


def test_mixed_shapes_fail_the_batch_naming_both_shapes() -> None:
    collate = ImageCollator()
    with pytest.raises(ValueError, match=r"\(8, 10, 3\).*\(9, 10, 3\)"):
        collate([picture(8, 10), picture(9, 10)])
    with pytest.raises(TypeError, match="3-D images"):
        collate([b"bytes"])
    with pytest.raises(ValueError, match="layout"):
        ImageCollator(layout="CHW")


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
