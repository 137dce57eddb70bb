"""Hostile items and locations: images in formats Decode does not document, 16-bit images,
mutated real files (a fuzz loop in a child process), credentials in odd location types, and
template values that would turn a relative path absolute."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yarl
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from asyncloader import FileDataset, HttpDataset, ObjectStoreDataset, Template
from asyncloader.transforms import Decode, ToFloat

ROOT = Path(__file__).parent.parent


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def ico_with_a_hidden_entry(size: int) -> bytes:
    """An ICO whose directory says 16x16, holding a PNG of ``size`` x ``size``."""
    png = encoded(Image.new("L", (size, size)), "PNG")
    head = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", 16, 16, 0, 0, 1, 32, len(png), 6 + 16)
    return head + entry + png


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(ico_with_a_hidden_entry(4000), id="ico"),
        pytest.param(EPS, id="eps"),
        pytest.param(encoded(Image.new("RGB", (8, 8)), "BMP"), id="bmp"),
        pytest.param(encoded(Image.new("RGB", (8, 8)), "GIF"), id="gif"),
        pytest.param(encoded(Image.new("RGB", (8, 8)), "TIFF"), id="tiff"),
        pytest.param(encoded(Image.new("RGB", (8, 8)), "PPM"), id="ppm"),
    ],
)
def test_formats_decode_does_not_document_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="cannot be decoded: not a JPEG, PNG or WebP image"):
        Decode()(7, data)


def test_the_documented_formats_decode() -> None:
    rgb = Image.fromarray(np.arange(48 * 3, dtype=np.uint8).reshape(4, 12, 3))
    for fmt, options in [("PNG", {}), ("WEBP", {"lossless": True})]:
        out = Decode()(0, encoded(rgb, fmt, **options))
        assert np.array_equal(out, np.asarray(rgb))
    assert Decode()(0, encoded(rgb, "JPEG")).shape == (4, 12, 3)
    assert Decode()(0, encoded(rgb.convert("1"), "PNG")).shape == (4, 12, 1)


def progressive_jpeg_with_scans(extra: int) -> bytes:
    """A 512x512 progressive JPEG with its last scan repeated ``extra`` more times: each
    scan costs a pass over the image's coefficients, each repeat 12 bytes."""
    image = Image.fromarray(np.zeros((512, 512, 3), np.uint8))
    data = encoded(image, "JPEG", progressive=True)
    last = data.rindex(b"\xff\xda")
    return data[:-2] + data[last:-2] * extra + b"\xff\xd9"


def test_a_jpeg_of_too_many_scans_is_refused_before_decoding() -> None:
    # A 41 KB file of 1,000 progressive scans took 2.2 s of a core to decode at 2048x2048
    # (0.14 s at this size), some 45 s by that scale at max_pixels: time grows with each scan.
    bomb = progressive_jpeg_with_scans(1000)
    for item in (bomb, bytearray(bomb), memoryview(bomb), np.frombuffer(bomb, np.uint8)):
        with pytest.raises(ValueError, match="item 3 is a JPEG of more than max_scans=100 scans"):
            Decode()(3, item)
    progressive = progressive_jpeg_with_scans(0)  # 10 scans, as Pillow writes them
    assert Decode()(0, progressive).shape == (512, 512, 3)
    assert Decode(max_scans=10)(0, progressive).shape == (512, 512, 3)
    with pytest.raises(ValueError, match="more than max_scans=9 scans"):
        Decode(max_scans=9)(0, progressive)
    with pytest.raises(ValueError, match="Inconsistent progression"):  # decoded: invalid after
        Decode(max_scans=None)(0, progressive_jpeg_with_scans(3))
    for name in ("max_scans", "max_pixels", "max_bytes"):
        for bad in (0, -1, 2.5, True):
            with pytest.raises(ValueError, match=name):
                Decode(**{name: bad})  # type: ignore[arg-type]


def test_a_16_bit_gray_png_keeps_its_values() -> None:
    values = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)
    out = Decode()(0, encoded(Image.fromarray(values), "PNG"))
    assert out.shape == (64, 64, 1)
    assert out.dtype == np.uint16
    assert np.array_equal(out[:, :, 0], values)
    scaled = ToFloat()(0, out)
    assert scaled.dtype == np.float32
    assert float(np.max(scaled)) == pytest.approx(float(np.max(values)) / 65535)


def test_a_fuzz_loop_over_mutated_real_images_finds_nothing() -> None:
    """20,000 mutated JPEG, PNG and WebP files; a decoder crash would kill only the child."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_decode", "20000", "17"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    summary = json.loads(lines[-1])
    assert summary["bad"] == 0, lines[:-1]
    refused = sum(v for k, v in summary.items() if k.endswith("refused"))
    decoded = sum(v for k, v in summary.items() if k.endswith("decoded"))
    assert refused + decoded == 20000
    assert refused > 1000
    assert decoded > 1000
    assert summary["peak_rss_mib"] < 400, summary  # no bomb decoded past max_pixels


SECRET_URL = "https://user:hunter2@example.com/x?X-Amz-Signature=SIGNED"


@pytest.mark.parametrize("location", [yarl.URL(SECRET_URL), SECRET_URL.encode(), None, 3.5])
def test_a_location_that_is_not_a_str_is_refused_without_its_value(location: object) -> None:
    for dataset in (
        HttpDataset([location]),
        FileDataset([location]),
        ObjectStoreDataset("memory://", [location]),
    ):
        with pytest.raises(TypeError, match="not a str") as caught:
            dataset.locations[0]
        assert "hunter2" not in str(caught.value)
        assert "SIGNED" not in str(caught.value)


def test_a_templates_repr_and_errors_hold_no_credential() -> None:
    template = Template(SECRET_URL + "&i={index}")
    assert "hunter2" not in repr(template)
    assert "SIGNED" not in repr(template)
    with pytest.raises(ValueError, match="no column") as caught:
        Template(SECRET_URL + "&{missing}")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(TypeError) as refused:
        Template(yarl.URL(SECRET_URL))  # type: ignore[arg-type]
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("root", [None, "root"])
def test_values_that_make_a_relative_path_absolute_are_refused(
    root: str | None, tmp_path: Path
) -> None:
    where = None if root is None else tmp_path
    data = FileDataset(Template("{split}/{index}.bin", split=["", "train"]), root=where)
    with pytest.raises(ValueError, match="absolute path"):
        data.locations[0]
    assert data.locations[1] == "train/1.bin"
    with pytest.raises(ValueError, match=r"\{index:c\}"):
        FileDataset(Template("{index:c}.bin"), length=100, root=where)
    # An absolute pattern too: index 0 renders as NUL, 47 as '/'.
    with pytest.raises(ValueError, match=r"\{index:c\}"):
        FileDataset(Template(str(tmp_path) + "/{index:c}.bin"), length=100, root=where)
    with pytest.raises(ValueError, match=r"\{index:c\}"):
        ObjectStoreDataset("memory://", Template("/{index:c}/k"), length=100)
    with pytest.raises(ValueError, match="absolute path"):
        ObjectStoreDataset("memory://", Template("{a}/k", a=[""])).locations[0]


def test_an_absolute_pattern_stays_the_users_choice(tmp_path: Path) -> None:
    data = FileDataset(Template(str(tmp_path) + "/{index}.bin"), length=2)
    assert data.locations[1] == f"{tmp_path}/1.bin"


SPECS = st.sampled_from(["", "d", "08d", "x", "o", "b", "c", ">5", "<3", "^4", "n", "_d"])


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.text(max_size=3),
    value=st.text(max_size=4),
    spec=SPECS,
    index=st.integers(0, 0x10FFFF),
)
@example(prefix="/", value="", spec="c", index=0)  # an absolute pattern's {index:c}: NUL
def test_no_value_or_index_makes_a_relative_path_absolute_or_leave_its_component(
    prefix: str, value: str, spec: str, index: int
) -> None:
    pattern = prefix.replace("{", "").replace("}", "") + "{v}{index:" + spec + "}/x"
    try:
        data = FileDataset(Template(pattern, v=[value] * (index + 1)))
    except ValueError:
        return  # refused when built
    try:
        location = data.locations[index]
    except ValueError:
        return  # refused for this item
    assert isinstance(location, str)
    if not pattern.startswith(("/", "\\")):
        assert not location.startswith(("/", "\\")), (pattern, value, location)
    assert "\x00" not in location.replace(pattern.split("{", 1)[0], "", 1)
