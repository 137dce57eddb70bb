"""The tar parser of TarShards against the standard library's tarfile, and hostile tars.

Archives are written by tarfile in each of its formats (ustar, GNU long names, pax), plain and
compressed, and fed in chunks of any size: the parser must give the samples that tarfile's
members make, grouped WebDataset's way. Any bytes at all give samples or a ShardError, never
another exception; a bomb costs no more memory than its limit.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import struct
import tarfile
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from asyncloader.datasets._tar import (
    INFLATE_STEP,
    ShardError,
    TarParser,
    _number,
    split_name,
    unsigned_checksum,
)

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
COMPRESS = {
    "none": lambda data: data,
    "gz": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


def write(members: list[tuple[str, bytes]], form: str = "gnu", compress: str = "none") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=FORMATS[form]) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return COMPRESS[compress](out.getvalue())  # type: ignore[no-any-return]


def fed(parser: TarParser, chunk: bytes) -> list[Any]:
    """The samples ``chunk`` completes, every step of it."""
    return [sample for step in parser.feed(chunk) for sample in step]


def parse(data: bytes, chunk: int = 4096, max_bytes: int | None = None) -> tuple[list[Any], Any]:
    parser = TarParser("s.tar", max_bytes)
    out: list[Any] = []
    for start in range(0, len(data), chunk):
        out += fed(parser, data[start : start + chunk])
    out += parser.close()
    return out, parser.error


def tarfile_samples(data: bytes) -> list[dict[str, Any]]:
    """What tarfile's members make, grouped as WebDataset does: the reference."""
    samples: list[dict[str, Any]] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as archive:
        for member in archive:
            parts = split_name(member.name)
            if not member.isreg() or parts is None:
                continue
            file = archive.extractfile(member)
            assert file is not None
            key, extension = parts
            if not samples or samples[-1]["__key__"] != key:
                samples.append({"__key__": key, "__shard__": "s.tar"})
            samples[-1][extension] = file.read()
    return samples


component = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/.\x00"),
    min_size=1,
    max_size=60,
)
names = st.tuples(
    st.lists(component, max_size=3).map(lambda parts: "".join(p + "/" for p in parts)),
    component,
    st.sampled_from(["jpg", "cls", "json", "tar.gz", "Txt"]),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    samples=st.lists(
        st.tuples(names, st.lists(st.binary(max_size=1500), min_size=1, max_size=3)),
        max_size=6,
    ),
    form=st.sampled_from(sorted(FORMATS)),
    compress=st.sampled_from(sorted(COMPRESS)),
    chunk=st.integers(1, 5000),
)
def test_the_parser_gives_what_tarfile_gives(
    samples: list[tuple[tuple[str, str, str], list[bytes]]], form: str, compress: str, chunk: int
) -> None:
    members = []
    for index, ((folder, key, extension), datas) in enumerate(samples):
        for number, data in enumerate(datas):
            # Keys of their own (index), and extensions of their own within a sample.
            members.append((f"{folder}{key}{index}.{number}{extension}", data))
    if form == "ustar" and any(len(name.encode()) > 100 for name, _ in members):
        return  # ustar cannot hold those names (tarfile raises writing them)
    data = write(members, form, compress)
    got, error = parse(data, chunk)
    assert error is None
    assert got == tarfile_samples(data)


KINDS = [tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE, tarfile.DIRTYPE]
KINDS += [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE, b"V"]
HAS_DATA = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE, b"V"}
"""The kinds tarfile reads data after (the regular ones, and a type it does not know)."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    members=st.lists(
        st.tuples(
            st.sampled_from(KINDS),
            st.sampled_from(["a.jpg", "b.cls", "d/c.json", "e" * 120 + ".jpg", "__meta__"]),
            st.sampled_from(["", "/", "//"]),
            st.booleans(),  # its name in a pax path
            st.binary(max_size=700),
        ),
        max_size=8,
    ),
    form=st.sampled_from(sorted(FORMATS)),
    chunk=st.integers(1, 3000),
)
def test_every_kind_of_member_gives_what_tarfile_gives(
    members: list[tuple[bytes, str, str, bool, bytes]], form: str, chunk: int
) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=FORMATS[form]) as archive:
        for number, (kind, name, slashes, pax, data) in enumerate(members):
            named = f"{number}{name}{slashes}"
            info = tarfile.TarInfo("x" if pax and form == "pax" else named)
            if pax and form == "pax":
                info.pax_headers = {"path": named}
            info.type = kind
            body = data if kind in HAS_DATA and not (kind == b"\0" and named.endswith("/")) else b""
            info.size = len(body)
            try:
                archive.addfile(info, io.BytesIO(body))
            except ValueError:  # a name ustar cannot hold
                return
    samples, error = parse(out.getvalue(), chunk)
    assert error is None
    assert samples == tarfile_samples(out.getvalue())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(1, 700))
def test_any_bytes_give_samples_or_a_shard_error(data: bytes, chunk: int) -> None:
    samples, error = parse(data, chunk)
    assert all(isinstance(s, dict) for s in samples)
    assert error is None or isinstance(error, ShardError)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2559), st.integers(1, 255))
def test_a_corrupted_shard_fails_with_a_shard_error(position: int, flip: int) -> None:
    data = bytearray(write([("a.jpg", b"x" * 700), ("b.jpg", b"y" * 300)]))
    data[position] ^= flip
    samples, error = parse(bytes(data))
    assert error is None or isinstance(error, ShardError)
    assert len(samples) <= 2


class GeneralOnly(TarParser):
    """The parser with its path for plain members turned off: every header read in full."""

    def _plain(self, view: memoryview, at: int, end: int) -> int:
        return at


def parse_with(
    kind: type[TarParser], data: bytes, chunk: int, max_bytes: int | None
) -> tuple[list[Any], str]:
    parser = kind("s.tar", max_bytes)
    out: list[Any] = []
    for start in range(0, len(data), chunk):
        out += fed(parser, data[start : start + chunk])
    out += parser.close()
    return out, str(parser.error)


PLAIN_NAMES = ["a.jpg", "a.JPG", "a.cls", "a.__key__", "a.__shard__", "b.jpg", "b.tar.gz"]
PLAIN_NAMES += ["__a__.jpg", "__a.b__", "a__b.jpg", "d/a.jpg", "d.e/a.jpg", "noext", ".jpg", "a."]
PLAIN_NAMES += ["\xe9.jpg", "f" * 120 + "/a.jpg"]
SIZE_FIELDS = [b"%011o\0", b"%012o", b"%011o ", b" %010o\0", b"%o\0", b"+%010o\0", b"%011o\0"]
PLAIN_KINDS = [tarfile.REGTYPE] * 4 + [tarfile.AREGTYPE, tarfile.SYMTYPE, tarfile.DIRTYPE]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    members=st.lists(
        st.tuples(st.sampled_from(PLAIN_NAMES), st.integers(0, 1500), st.sampled_from(PLAIN_KINDS)),
        min_size=1,
        max_size=8,
    ),
    form=st.sampled_from(sorted(FORMATS)),
    max_bytes=st.none() | st.integers(0, 3000),
    chunk=st.just(1 << 20) | st.integers(1, 4000),
    size_field=st.sampled_from(SIZE_FIELDS),
    corrupt=st.none() | st.tuples(st.integers(0, 1 << 14), st.integers(1, 255)),
)
@example([("a.jpg", 600, b"0"), ("a.cls", 600, b"0")], "gnu", 1000, 1 << 20, b"%011o\0", None)
@example([("a.jpg", 9, b"0"), ("b.jpg", 9, b"0")], "gnu", None, 1 << 20, b"%011o\0", (1172, 1))
@example([("f" * 120 + "/a.jpg", 9, b"0")], "ustar", None, 1 << 20, b"%011o\0", None)
@example([("a.jpg", 9, b"0")], "ustar", None, 1 << 20, b"%012o", None)
@example([("a.jpg", 9, b"0")], "ustar", None, 1 << 20, b"+%010o\0", None)
def test_plain_members_read_as_the_general_path_reads_them(
    members: list[tuple[str, int, bytes]],
    form: str,
    max_bytes: int | None,
    chunk: int,
    size_field: bytes,
    corrupt: tuple[int, int] | None,
) -> None:
    """The path for members as tarfile writes them gives the samples, and fails with the
    error, that reading every header in full gives: at each limit, kind, name, size field
    and cut. The examples: a sample over its bound, a bad header after a member (named in
    the error), a ustar prefix, a size field of 12 digits and no NUL, one with a sign."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=FORMATS[form]) as archive:
        for number, (name, size, kind) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = size if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            archive.addfile(info, io.BytesIO(bytes([number]) * info.size))
    data = bytearray(out.getvalue())
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as archive:
        for member in archive.getmembers():  # each member's own header, resized
            at = member.offset_data - 512
            data[at + 124 : at + 136] = (size_field % member.size).ljust(12, b"\0")
            data[at + 148 : at + 156] = b" " * 8
            data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + 512])
    if corrupt is not None:
        data[corrupt[0] % len(data)] ^= corrupt[1]
    general = parse_with(GeneralOnly, bytes(data), chunk, max_bytes)
    assert parse_with(TarParser, bytes(data), chunk, max_bytes) == general


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=512, max_size=512) | st.sampled_from([b"\xff" * 512, bytes(512)]))
def test_the_header_checksum_is_tarfiles(block: bytes) -> None:
    # tarfile's own formula: the bytes around the checksum field, and 8 spaces for it.
    assert unsigned_checksum(block) == 256 + sum(struct.unpack_from("148B8x356B", block))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (b"00000040000\x00", 0o40000),
        (b"  17 \x00junk\x00 ", 0o17),  # whitespace around the digits, anything after a NUL
        (b"\x00" * 12, 0),
        (b" " * 12, 0),
        (b"0 1\x00", None),
        (b"18\x00", None),
        (b"+1\x00", None),
        (b"\x80" + (5).to_bytes(11, "big"), 5),  # GNU base-256
    ],
)
def test_numeric_fields_are_read_as_tarfile_reads_valid_ones(
    field: bytes, value: int | None
) -> None:
    assert _number(field) == value


def by_pattern(field: bytes) -> int | None:
    """``_number`` as the pattern alone reads a field (its fast path must agree)."""
    if field[0] in (0o200, 0o377):
        return None
    match = re.fullmatch(rb"\s*([0-7]*)\s*(?:\0.*)?", field, re.DOTALL)
    return None if match is None else int(match.group(1) or b"0", 8)


FIELD_BYTES = st.sampled_from(b"0123456789 +-_\x00\t\n\x0b\xa0x")


@given(st.lists(FIELD_BYTES, min_size=1, max_size=12).map(bytes))
def test_a_numeric_field_reads_as_the_pattern_reads_it(field: bytes) -> None:
    if field[0] not in (0o200, 0o377):
        assert _number(field) == by_pattern(field)


@given(st.text(st.sampled_from("ab.Z/_-\n\u00e9\udcff"), max_size=12))
def test_a_name_splits_as_the_pattern_splits_it(name: str) -> None:
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    assert split_name(name) == (None if match is None else (match[1], match[2].lower()))


def test_members_that_are_not_files_are_passed_over() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, kind in [("dir", tarfile.DIRTYPE), ("link.jpg", tarfile.SYMTYPE)]:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/passwd"
            archive.addfile(info)
        for name in ("__meta__", "a.jpg"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"z"))
    samples, error = parse(out.getvalue())
    assert error is None
    assert samples == [{"__key__": "a", "__shard__": "s.tar", "jpg": b"z"}]


def test_names_of_no_key_are_passed_over_within_a_sample_too() -> None:
    # A README, or the "._" file macOS tar writes beside each file: the shard failed at it,
    # where webdataset passes over it (and a sample it falls in stays whole).
    data = write([("a.jpg", b"A"), ("README", b"r"), ("._a.cls", b"x"), ("a.cls", b"1")])
    samples, error = parse(data)
    assert error is None
    assert samples == tarfile_samples(data)
    assert samples == [{"__key__": "a", "__shard__": "s.tar", "jpg": b"A", "cls": b"1"}]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("link", b"1"),
        ("link", b"2"),
        ("dev", b"3"),
        ("dev", b"4"),
        ("dir", b"5"),
        ("fifo", b"6"),
        ("v7dir/", b"\0"),
    ],
)
def test_links_devices_and_folders_have_no_data_whatever_their_size_says(
    name: str, kind: bytes
) -> None:
    # tarfile reads no data after these, whatever their size field says: the parser took
    # the next 1,024 bytes (b's header and data) as theirs and lost sample b, silently.
    data = (
        write([("a.jpg", b"A")])[:1024]
        + header(name, b"00000001750\x00", kind=kind)
        + write([("b.jpg", b"B")])
    )
    samples, error = parse(data)
    assert error is None
    assert samples == tarfile_samples(data)
    assert [s["__key__"] for s in samples] == ["a", "b"]


def test_a_pax_path_ends_in_no_slash_as_tarfile_reads_it() -> None:
    # tarfile strips a pax path's trailing slashes: "b.jpg/" names the file b.jpg, a sample,
    # which the parser passed over as a folder, silently.
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, path in (("a.jpg", None), ("b.jpg", "b.jpg//"), ("c.jpg", None)):
            info = tarfile.TarInfo(name)
            info.size = 1
            if path is not None:
                info.pax_headers = {"path": path}
            archive.addfile(info, io.BytesIO(name[:1].encode()))
    samples, error = parse(out.getvalue())
    assert error is None
    assert samples == tarfile_samples(out.getvalue())
    assert [s["__key__"] for s in samples] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [("vol", b"V"), ("__meta__", b"0"), ("x", b"K"), ("README", b"0"), ("._a.jpg", b"0")],
)
def test_members_passed_over_are_not_held_whatever_their_size(name: str, kind: bytes) -> None:
    # 64 MiB of zeros in a member that is no sample's (an unknown type, WebDataset's
    # metadata, a long link name), 290 KB gzipped: held whole, 135 MiB traced under
    # max_bytes=1 MiB. tarfile passes over their data too.
    size = 64 << 20
    data = (
        write([("a.jpg", b"A")])[:1024]
        + header(name, f"{size:011o}\x00".encode(), kind=kind)
        + bytes(size)
        + write([("b.jpg", b"B")])
    )
    assert [s["__key__"] for s in tarfile_samples(data)] == ["a", "b"]
    packed = gzip.compress(data, 1)
    tracemalloc.start()
    try:
        samples, error = parse(packed, chunk=65536, max_bytes=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error is None
    assert [s["__key__"] for s in samples] == ["a", "b"]
    assert peak < 6 * 2**20


def header(name: str, size_field: bytes, kind: bytes = b"0") -> bytes:
    """A ustar header with a given size field and type, its checksum right."""
    block = bytearray(512)
    block[0 : len(name)] = name.encode()
    block[124:136] = size_field
    block[156:157] = kind
    block[257:263] = b"ustar\x00"
    block[148:156] = b" " * 8
    block[148:156] = f"{sum(block):06o}\x00 ".encode()
    return bytes(block)


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        (header("a.jpg", b"\xff" * 12), "invalid size"),  # base-256, negative
        (header("a.jpg", b"-0000000001\x00"), "invalid size"),
        (header("a.jpg", b"0000000001_0"), "invalid size"),
        (header("a.jpg", b"00000000001\x00", kind=b"S"), "sparse"),
        (header("a.jpg", b"00000000001\x00")[:148] + b"9" * 8 + bytes(356), "not a tar"),
    ],
)
def test_hostile_headers_fail_naming_the_shard_and_the_member(block: bytes, problem: str) -> None:
    _, error = parse(block + b"z" + bytes(511) + bytes(1024))
    assert isinstance(error, ShardError)
    assert "shard s.tar" in str(error)
    assert problem in str(error)


def pax_member(records: bytes) -> bytes:
    """A pax extended header holding ``records``, then a one-byte member and the archive's
    end."""
    data = records + bytes(-len(records) % 512)
    size = f"{len(records):011o}\x00".encode()
    member = header("a.jpg", b"00000000001\x00") + b"z" + bytes(511)
    return header("pax", size, kind=b"x") + data + member + bytes(1024)


@pytest.mark.parametrize(
    "records",
    [
        b"5011 size=" + b"9" * 5000 + b"\n",  # more digits than int() converts
        b"9" * 5000 + b" path=x\n",  # a record's length, the same
        b"11 size=\xd9\xa3\n",  # a digit, but not an ASCII one
    ],
)
def test_hostile_pax_numbers_fail_naming_the_shard_and_the_member(records: bytes) -> None:
    _, error = parse(pax_member(records))
    assert isinstance(error, ShardError)
    assert "shard s.tar" in str(error)
    assert "'pax'" in str(error) or "'a.jpg'" in str(error)


def pax_record(key: str, value: str) -> bytes:
    """One pax record: its length counts itself."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


@pytest.mark.parametrize("kind", [b"x", b"g"])
def test_extended_headers_cost_no_more_memory_than_their_limit(kind: bytes) -> None:
    # 40 headers of 530 KB each, every record a new key, before one member: pax records
    # accumulate (a global one for the archive, a local one until its member), so without a
    # bound on them all, the parser would hold the stream (gzip makes that a bomb).
    headers = []
    for number in range(40):
        records = b"".join(pax_record(f"k{number}_{i}", "v" * 200) for i in range(2500))
        size = f"{len(records):011o}\x00".encode()
        headers.append(header("pax", size, kind=kind) + records + bytes(-len(records) % 512))
    member = header("a.jpg", b"00000000001\x00") + b"z" + bytes(511)
    data = gzip.compress(b"".join(headers) + member + bytes(1024))
    tracemalloc.start()
    try:
        samples, error = parse(data, chunk=65536)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert samples == []
    assert isinstance(error, ShardError)
    assert "shard s.tar: member 'pax' has extended headers of over 1048576 bytes" in str(error)
    assert peak < 6 * 2**20


def test_a_member_over_max_bytes_fails_before_its_data_is_held() -> None:
    data = write([("a.jpg", b"ok"), ("b.jpg", b"q" * 100_000)])
    parser = TarParser("s.tar", max_bytes=1000)
    samples = fed(parser, data[:2048])  # b's header, and only the start of its data
    assert samples == [{"__key__": "a", "__shard__": "s.tar", "jpg": b"ok"}]
    assert parser.error is not None
    assert "'b.jpg' is 100000 bytes, over max_bytes=1000" in str(parser.error)


@pytest.mark.parametrize("extension", ["__key__", "__shard__", "__KEY__"])
def test_a_member_named_as_a_samples_own_key_fails_its_shard(extension: str) -> None:
    # b.__key__ replaced sample b's key with its bytes, and b.jpg after it made a second
    # sample b; b.__shard__ replaced the shard's name (webdataset refuses both, as duplicates).
    data = write([("a.jpg", b"1"), (f"b.{extension}", b"evil"), ("b.jpg", b"2"), ("c.jpg", b"3")])
    samples, error = parse(data)
    assert samples == [{"__key__": "a", "__shard__": "s.tar", "jpg": b"1"}]
    assert isinstance(error, ShardError)
    assert f"member 'b.{extension}' is named as the sample's own {extension.lower()!r}" in str(
        error
    )


def test_a_cut_shard_or_one_without_its_end_fails() -> None:
    data = write([("a.jpg", b"1" * 600), ("b.jpg", b"2" * 600)])
    for cut in (700, 1536, 2560):  # in a member's data, after a member, after both
        samples, error = parse(data[:cut])
        assert isinstance(error, ShardError), cut
        assert "without tar's end-of-archive block" in str(error)
        assert len(samples) < 2 or cut == 2560


def _peak(data: bytes, max_bytes: int | None) -> tuple[list[Any], Any, int]:
    tracemalloc.start()
    try:
        samples, error = parse(data, chunk=65536, max_bytes=max_bytes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return samples, error, peak


def test_a_compressed_bomb_costs_no_more_memory_than_the_limit() -> None:
    # A 64 MiB member of zeros: a gzip stream of about 64 KiB.
    bomb = gzip.compress(write([("a.bin", b"\0" * 2**26)]))
    samples, error, peak = _peak(bomb, max_bytes=2**20)
    assert samples == []
    assert "over max_bytes" in str(error)
    assert peak < 4 * INFLATE_STEP


def test_a_samples_members_together_are_bounded_by_max_bytes() -> None:
    # One key, 2,000 members of 32 KiB: each under max_bytes, 62.5 MiB together, a gzip
    # stream of about 130 KiB. Held whole before, as one sample.
    bomb = gzip.compress(write([(f"a.x{i:05d}", b"\0" * 2**15) for i in range(2000)]))
    samples, error, peak = _peak(bomb, max_bytes=2**20)
    assert samples == []
    assert isinstance(error, ShardError)
    assert "member 'a.x00032' takes sample 'a' over max_bytes=1048576" in str(error)
    assert peak < 4 * INFLATE_STEP
    # Empty members count too: each after the first as a tar block.
    empty = write([("a.jpg", b"x" * 1000), *((f"a.e{i}", b"") for i in range(100))])
    samples, error = parse(empty, max_bytes=1000 + 512 * 10)
    assert samples == []
    assert "member 'a.e10' takes sample 'a' over max_bytes=6120" in str(error)
    assert parse(empty, max_bytes=1000 + 512 * 100) == ([parse(empty)[0][0]], None)


def test_a_compressed_chunk_is_inflated_a_step_at_a_time() -> None:
    # 2,000 samples of 32 KiB of zeros: 62.5 MiB from a gzip stream of about 130 KiB, whose
    # first 64 KiB gave 991 samples (30 MiB) in one call before.
    members = [(f"{i:06d}.bin", b"\0" * 2**15) for i in range(2000)]
    bomb = gzip.compress(write(members))
    parser = TarParser("s.tar.gz", 2**20)
    steps = parser.feed(bomb[:65536])
    first = next(steps)
    assert 0 < len(first) <= INFLATE_STEP // 2**15
    rest = [sample for step in steps for sample in step]
    assert len(first) + len(rest) > 900
    assert [s["__key__"] for s in first + rest] == [f"{i:06d}" for i in range(len(first + rest))]
    assert parse(bomb, chunk=65536)[0] == parse(write(members))[0]


def test_a_compressed_stream_is_inflated_no_further_than_the_archives_end() -> None:
    bomb = gzip.compress(write([("a.jpg", b"x")]) + bytes(2**27))  # 128 MiB of zeros after it
    samples, error, peak = _peak(bomb, max_bytes=None)
    assert error is None
    assert samples == [{"__key__": "a", "__shard__": "s.tar", "jpg": b"x"}]
    assert peak < 4 * INFLATE_STEP


@pytest.mark.parametrize("chunk", [1, 100, 4096, 1 << 20])
@pytest.mark.parametrize("compress", ["gz", "bz2", "xz"])
def test_a_compressed_file_of_many_streams_is_read_whole(chunk: int, compress: str) -> None:
    # A gzip file is a series of members (RFC 1952), and bz2 and xz files series of streams:
    # bgzip and pbzip2 write many, `cat` of two files makes two. The parser stopped at the
    # first one's end and failed the shard as cut short after 10 of its 20 samples (Python's
    # gzip, bz2 and lzma modules, tar xf and tarfile's seekable modes read them all).
    data = write([(f"{i}.txt", bytes([i]) * 3000) for i in range(20)])
    third = len(data) // 3
    pieces = (COMPRESS[compress](data[at : at + third]) for at in range(0, len(data), third))
    members = b"".join(pieces)
    assert {"gz": gzip, "bz2": bz2, "xz": lzma}[compress].decompress(members) == data
    samples, error = parse(members, chunk)
    assert error is None
    assert samples == tarfile_samples(data)
    assert len(samples) == 20
