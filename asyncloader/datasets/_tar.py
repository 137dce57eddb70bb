"""WebDataset samples from one tar stream, parsed as its chunks arrive.

A member ``dir/000123.jpg`` has the key ``dir/000123`` and the extension ``jpg`` (everything
after the first dot of its last component, lower-cased), as WebDataset splits them, so that
``000123.jpg``, ``000123.cls`` and ``000123.json`` become one sample
``{"__key__": "000123", "__shard__": shard, "jpg": b"...", "cls": b"...", "json": b"..."}``.

:class:`TarParser` is fed the stream's chunks (gzip, bzip2 or xz ones are inflated first, as
tarfile's ``r|*`` mode would, also a file of many members or streams, which that mode refuses)
and gives the samples each chunk completes, so a shard is read with one streaming request and
parsed on the event loop as it comes, holding only the sample being read. A compressed chunk is
inflated a step at a time, each step's samples given before the next step is made, so that the
caller can wait for room between them. It reads the formats :mod:`tarfile` writes and reads
(ustar, GNU long names, pax ``path`` and ``size`` records) the way tarfile reads them, and the
tests check that it gives what tarfile gives; members as tarfile writes a sample's file, nearly
all of them in a shard, take a shorter path of their own (:meth:`TarParser._plain`), which the
tests check against the general one. tarfile itself is not used: its stream mode reads
with blocking calls (a thread per open shard), and parsing with it cost most of the loader's
time per sample (the figures are in docs/streaming.md, "Parsing").

Every header is hostile: its checksum is checked, sizes are octal digits or base-256 and never
negative, a member's size, and its sample's with it, are checked against ``max_bytes`` before
its data is held, names are only split (never used as paths), members that are not regular
files (links, folders, devices), WebDataset's ``__meta__`` files and names of no key or no
extension (a README, macOS tar's ``._`` files: webdataset passes over them too) are passed
over (their data, where tarfile reads any, never held), and sparse members are refused. A
stream that is not a tar, has a bad header, ends before tar's end-of-archive block, or has a
member that takes its sample over the limit, an extension twice in one sample, or one that is
a key the parser gives the sample (``__key__``, ``__shard__``) sets the
parser's ``error`` to a :class:`ShardError` naming the shard and the member (the samples
before it are still handed out). A compressed stream is inflated at most
:data:`INFLATE_STEP` bytes at a time and no further than the end of the archive, and the
extended headers held at once (long names, pax records, which add up) are bounded as one sample
is, so a decompression bomb costs no more memory than its largest sample and one step.
"""

from __future__ import annotations

import bz2
import lzma
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Final

BLOCK: Final = 512
ZEROS: Final = bytes(BLOCK)
INFLATE_STEP: Final = 1 << 20
"""The most bytes one step of inflating a compressed shard makes."""

_KEY: Final = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
"""WebDataset's split of a member name into key and extension."""
_META: Final = re.compile(r"(^|/)__[^/]*__$")
_NUMBER: Final = re.compile(rb"\s*([0-7]*)\s*(?:\0.*)?", re.DOTALL)
"""Octal digits with whitespace around them, up to the field's first NUL if it has one."""
_PAX_RECORD: Final = re.compile(rb"([0-9]{1,19}) ([^=]+)=")
_PAX_SIZE: Final = re.compile(r"[0-9]{1,19}")
"""Decimal numbers in pax records: ASCII digits, 19 at most (more than any size a member can
have; int() refuses a string of thousands, and takes non-ASCII digits)."""
_REGULAR: Final = frozenset({b"0", b"\0", b"7"})
_NAMES: Final = frozenset({b"L", b"x", b"g"})
"""GNU long names and pax headers: they name (or size) the member that follows."""
_NO_DATA: Final = frozenset({b"1", b"2", b"3", b"4", b"5", b"6"})
"""Links, devices, folders and FIFOs: tarfile reads no data after them, whatever their size
field (or a pax ``size``) says, so neither does the parser."""
_OWN: Final = frozenset({"__key__", "__shard__"})
"""The keys the parser gives each sample: a member with such an extension would replace one."""
_FIRST: Final = "(the first header)"
_SIGNED: Final = struct.Struct("148b8x356b")
_HALVES: Final = struct.Struct("256s256s")
_FIELDS: Final = struct.Struct("100s24x12s12x8sc")
"""The name, size, checksum and type fields, all in a header's first half."""


_Header = tuple[str, int, bytes, tuple[str, str] | None]
"""A member's name, size, type, and its key and extension if it is a sample's."""


class ShardError(OSError):
    """A shard could not be read to its end: its remaining samples are lost."""


class _Zlib:
    """gzip: a series of members (RFC 1952; bgzip writes many, as ``cat`` of two files does),
    each inflated in turn."""

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def step(self, data: bytes) -> bytes:
        inflate = self._inflate
        if inflate.eof:  # the member ended: what follows is the next one's
            data = inflate.unused_data + data
            if not data:
                return b""
            inflate = self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return inflate.decompress(inflate.unconsumed_tail + data, INFLATE_STEP)

    @property
    def pending(self) -> bool:
        inflate = self._inflate
        return bool(inflate.unconsumed_tail or (inflate.eof and inflate.unused_data))


class _Stepped:
    """bz2 and lzma: ``max_length`` steps, with ``needs_input``; a series of streams (pbzip2
    writes many), each inflated in turn."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._inflate = make()

    def step(self, data: bytes) -> bytes:
        inflate = self._inflate
        if inflate.eof:  # the stream ended: what follows is the next one's
            data = inflate.unused_data + data
            if not data:
                return b""
            inflate = self._inflate = self._make()
        out: bytes = inflate.decompress(data, INFLATE_STEP)
        return out

    @property
    def pending(self) -> bool:
        inflate = self._inflate
        if inflate.eof:
            return bool(inflate.unused_data)
        return not inflate.needs_input


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name, WebDataset's way; ``None`` if it has none."""
    if "/" not in name:  # the usual name: the split at its first dot, which the pattern makes
        dot = name.find(".")
        return None if dot <= 0 else (name[:dot], name[dot + 1 :].lower())
    match = _KEY.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def _shown(name: str) -> str:
    """A member name as a message shows it: printable, and short."""
    text = name.encode("unicode_escape", "replace").decode("ascii", "replace")
    return repr(text if len(text) <= 120 else text[:117] + "...")


def _text(field: bytes) -> str:
    """A NUL-terminated name field, decoded as tarfile does (UTF-8, surrogate escapes)."""
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int | None:
    """A size field: octal digits (spaces and NULs around them), or GNU's base-256."""
    if field[-1] == 0:  # as tarfile writes it, ASCII digits then a NUL: nothing to strip
        digits = field[:-1]
        if digits.isdigit():
            try:
                return int(digits, 8)
            except ValueError:  # an 8 or a 9
                return None
    if field[0] == 0o200:
        return int.from_bytes(field[1:], "big")
    if field[0] == 0o377:
        return None  # base-256 negative
    match = _NUMBER.fullmatch(field)
    return None if match is None else int(match.group(1) or b"0", 8)


def unsigned_checksum(block: bytes) -> int:
    """tar's checksum of a header: the sum of its bytes, its checksum field counted as spaces."""
    return _halves_checksum(block[:256], block[256:])


def _halves_checksum(first: bytes, second: bytes) -> int:
    """:func:`unsigned_checksum` of the header whose halves these are.

    Adler-32's first half is one plus the sum of the bytes, modulo 65521, which 256 bytes
    never reach: a header's sum in two calls, against a Python loop over its 512 bytes.
    """
    halves = (zlib.adler32(first) & 0xFFFF) + (zlib.adler32(second) & 0xFFFF) - 2
    return halves - sum(first[148:156]) + 256


class TarParser:
    """One shard's samples, from its chunks in order.

    Args:
        shard: How messages (and each sample's ``__shard__``) name the shard.
        max_bytes: The largest sample accepted: its members' sizes together, each member
            after the first counted as at least one tar block (so that a sample of many
            empty members is bounded too).
    """

    def __init__(self, shard: str, max_bytes: int | None) -> None:
        self.shard = shard
        self.max_bytes = max_bytes
        self._partial = bytearray()
        """Bytes of a unit (a header, or a member's data) that a chunk's end cut."""
        self._inflater: _Zlib | _Stepped | None = None
        self._sniffed = False
        self._ended = False
        self._sample: dict[str, Any] | None = None
        self._sample_bytes = 0
        """The bytes :attr:`_sample` counts against ``max_bytes`` so far."""
        self._member = _FIRST
        self._header: _Header | None = None
        """The header whose data is awaited: its name, size, type, key and extension."""
        self._global: dict[str, str] = {}
        self._local: dict[str, str] = {}
        self._extended = max(max_bytes or 0, 1 << 20)
        """The most bytes of extended headers (long names, pax records) held at once."""
        self._held = [0, 0]
        """The bytes of the pax records held: the global ones, and the next member's."""
        self._long_name: str | None = None
        self._discard = 0
        """Bytes still to pass over: the data of a member that is no sample's, never held."""
        self._out: list[dict[str, Any]] = []
        self.error: ShardError | None = None
        """Why the shard could not be read to its end, once that is known."""

    @property
    def ended(self) -> bool:
        """Whether tar's end-of-archive block was read: what follows it is not the shard's."""
        return self._ended

    def feed(self, chunk: bytes) -> Iterator[list[dict[str, Any]]]:
        """The samples that ``chunk`` completes, a list for each step: one for a plain
        chunk, one for each :data:`INFLATE_STEP` inflated of a compressed one, the next step
        made only when it is asked for. After a fault, :attr:`error` says what it was (the
        samples before it are still given) and the rest is ignored."""
        if self.error is None and not self._ended:
            try:
                for _ in self._feed(chunk):
                    yield self._taken()
            except ShardError as error:
                self.error = error
        yield self._taken()

    def _taken(self) -> list[dict[str, Any]]:
        out, self._out = self._out, []
        return out

    def close(self) -> list[dict[str, Any]]:
        """The last samples, once the stream has ended; :attr:`error` is set if the stream
        ended before tar's end-of-archive block."""
        out: list[dict[str, Any]] = []
        if self.error is None and not self._sniffed and self._partial:
            self._sniff()
            chunk, self._partial = bytes(self._partial), bytearray()
            for step in self.feed(chunk):
                out += step
        if self.error is None and not self._ended:
            if self._member == _FIRST:
                where = "before its first header"
            else:
                where = f"after member {_shown(self._member)}"
            self.error = ShardError(
                f"shard {self.shard}: ends {where} without tar's end-of-archive block "
                "(cut short, or not a tar)"
            )
        return out + self._taken()

    def _feed(self, chunk: Any) -> Iterator[None]:
        """Parse ``chunk``, pausing after each step of inflating it but the last."""
        if not self._sniffed:
            self._partial += chunk
            if len(self._partial) < 6:
                return
            self._sniff()
            chunk, self._partial = bytes(self._partial), bytearray()
        if self._inflater is None:
            self._parse(chunk)
        else:
            yield from self._inflate(chunk)

    def _sniff(self) -> None:
        self._sniffed = True
        head = bytes(self._partial[:6])
        if head.startswith(b"\x1f\x8b"):
            self._inflater = _Zlib()
        elif head.startswith(b"BZh"):
            self._inflater = _Stepped(bz2.BZ2Decompressor)
        elif head.startswith(b"\xfd7zXZ\x00"):
            self._inflater = _Stepped(lzma.LZMADecompressor)

    def _inflate(self, chunk: Any) -> Iterator[None]:
        inflater = self._inflater
        assert inflater is not None
        try:
            data = inflater.step(bytes(chunk))
            while True:
                self._parse(data)
                if self._ended or not inflater.pending:
                    return
                del data  # parsed: not held while the next step is made
                yield
                data = inflater.step(b"")
        except (zlib.error, lzma.LZMAError, OSError, EOFError) as error:
            raise ShardError(f"shard {self.shard}: cannot be decompressed ({error})") from None

    def _fail(self, name: str, problem: str) -> ShardError:
        return ShardError(f"shard {self.shard}: member {_shown(name)} {problem}")

    def _needed(self) -> int:
        """The bytes of the unit being read: a header, or the member's padded data."""
        if self._header is None:
            return BLOCK
        size = self._header[1]
        return size + -size % BLOCK

    def _parse(self, chunk: Any) -> None:
        """Parse ``chunk`` in place; only a unit cut by its end is copied aside, and each
        member's data is copied once, into its sample."""
        with memoryview(chunk) as view:
            at = 0
            partial = self._partial
            if partial:  # the unit the last chunk cut: complete it first
                take = min(self._needed() - len(partial), len(view))
                partial += view[:take]
                at = take
                if len(partial) < self._needed():
                    return
                with memoryview(partial) as cut:
                    self._units(cut, 0)
                partial.clear()
            at = self._units(view, at)
            if not self._ended:
                partial += view[at:]

    def _units(self, view: memoryview, at: int) -> int:
        """Read the whole units (headers, members' data) in ``view[at:]``, a header and its
        member's data in one step; where the first unit that is not whole begins."""
        end = len(view)
        while not self._ended:
            if self._header is None and not self._discard:
                at = self._plain(view, at, end)
            if self._discard:
                passed = min(self._discard, end - at)
                self._discard -= passed
                at += passed
                if self._discard:
                    return at
            header = self._header
            if header is None:
                if end - at < BLOCK:
                    return at
                block = view[at : at + BLOCK].tobytes()
                at += BLOCK
                if block == ZEROS:
                    self._end_archive()
                    return at
                header = self._read_header(block)
                if header[3] is None and header[2] not in _NAMES:
                    # No sample's, nor a name for the next: its data, of any size, is
                    # passed over as it comes (a 64 MiB member is 290 KB gzipped).
                    self._member_done(header, b"")
                    self._discard = header[1] + -header[1] % BLOCK
                    continue
                self._header = header
            size = header[1]
            needed = size + -size % BLOCK
            if end - at < needed:
                return at
            self._header = None
            self._member_done(header, view[at : at + size].tobytes())
            at += needed
        return at

    def _plain(self, view: memoryview, at: int, end: int) -> int:
        """Read the members in ``view[at:]`` that are as tarfile writes a sample's file, with
        less Python than :meth:`_read_header` and :meth:`_member_done` (which it gives the
        same result as); where the first other unit, or the first one not whole, begins.

        Such a member is a regular file (type ``0``) whose header has no ustar prefix and
        the size and checksum fields as tarfile writes them, with a name of a key and an
        extension and no folder nor ``__`` (WebDataset's metadata, the sample's own keys),
        no long name or pax record before it, whose
        sample stays within ``max_bytes`` and does not have its extension yet: anything else
        (the archive's end too) is left to the general path, which raises what it raises.
        """
        if self._long_name is not None or self._local or self._global or self._held[1]:
            return at
        limit = self.max_bytes
        halves, fields = _HALVES.unpack_from, _FIELDS.unpack_from
        while end - at >= BLOCK:
            first, second = halves(view, at)
            name_field, size_field, sum_field, kind = fields(first)
            digits = size_field[:11]
            if kind != b"0" or second[89] or size_field[11] or not digits.isdigit():
                return at  # second[89]: the ustar prefix's first byte
            try:
                size = int(digits, 8)
            except ValueError:  # an 8 or a 9
                return at
            if sum_field != b"%06o\0 " % _halves_checksum(first, second):
                return at
            data_at = at + BLOCK
            next_at = data_at + size + -size % BLOCK
            if next_at > end:
                return at
            nul = name_field.find(0)  # _text's work, inline: this runs for every member
            name = (name_field if nul < 0 else name_field[:nul]).decode("utf-8", "surrogateescape")
            parts = None if "/" in name or "__" in name else split_name(name)
            if parts is None:
                return at
            key, extension = parts  # never one of _OWN, which have "__"
            sample = self._sample
            if sample is None or sample["__key__"] != key:
                if limit is not None and size > limit:
                    return at
                if sample is not None:
                    self._out.append(sample)
                sample = self._sample = {"__key__": key, "__shard__": self.shard}
                self._sample_bytes = size
            else:
                held = self._sample_bytes + max(size, BLOCK)
                if extension in sample or (limit is not None and held > limit):
                    return at
                self._sample_bytes = held
            self._member = name
            sample[extension] = view[data_at : data_at + size].tobytes()
            at = next_at
        return at

    def _read_header(self, block: bytes) -> _Header:
        """The member's name, size, type, and its key and extension if it is a sample's."""
        unsigned = unsigned_checksum(block)
        if block[148:156] == b"%06o\0 " % unsigned:  # as tarfile writes it: nothing to parse
            stored: int | None = unsigned
        else:
            stored = _number(block[148:156])
        if stored != unsigned and stored != 256 + sum(_SIGNED.unpack(block)):
            if self._member == _FIRST:
                raise ShardError(f"shard {self.shard}: not a tar (no valid first header)")
            raise ShardError(
                f"shard {self.shard}: a bad header after member {_shown(self._member)} "
                "(its checksum does not match)"
            )
        kind = block[156:157]
        local = self._local
        # Long names and pax records, where there are any, name (and size) the member.
        extended = self._long_name is not None or local or self._global
        name = None
        if extended:
            path = local.get("path") or self._global.get("path")
            # tarfile strips a pax path's trailing slashes: "a.jpg/" names the file a.jpg.
            name = self._long_name or (None if path is None else path.rstrip("/"))
        if name is None:
            name = _text(block[0:100])
            if block[345] and kind not in (b"L", b"K", b"S"):  # a ustar prefix
                name = _text(block[345:500]) + "/" + name
        self._member = name
        size = _number(block[124:136])
        if extended:
            pax_size = local.get("size") or self._global.get("size")
            if pax_size is not None and kind not in _NAMES:
                size = int(pax_size) if _PAX_SIZE.fullmatch(pax_size) else None
        if size is None:
            raise self._fail(name, "has an invalid size field")
        if kind == b"\0" and _text(block[0:100]).endswith("/"):
            kind = b"5"  # old V7 tar's folder: a regular file whose name ends in a slash
        if kind in _NO_DATA:
            size = 0
        if kind == b"S" or (local and any(key.startswith("GNU.sparse") for key in local)):
            raise self._fail(name, "is a sparse file, which WebDataset shards never hold")
        parts = None
        meta = "__" in name and _META.search(name)
        if kind in _REGULAR and not name.endswith("/") and not meta:
            # A name of no key or extension (a README, macOS tar's "._" files) is no
            # sample's: passed over, as webdataset does, the sample around it kept whole.
            parts = split_name(name)
            if parts is not None:
                limit = self.max_bytes
                if parts[1] in _OWN:
                    self._flush_unless(parts)
                    raise self._fail(name, f"is named as the sample's own {parts[1]!r}")
                if limit is not None and size > limit:
                    self._flush_unless(parts)
                    raise self._fail(name, f"is {size} bytes, over max_bytes={limit}")
                sample = self._sample
                same = sample is not None and sample["__key__"] == parts[0]
                if limit is not None and same and self._sample_bytes + max(size, BLOCK) > limit:
                    raise self._fail(name, f"takes sample {parts[0]!r} over max_bytes={limit}")
        elif kind in _NAMES and size > self._extended:
            raise self._fail(name, f"has a {size}-byte extended header")
        return name, size, kind, parts

    def _member_done(self, header: _Header, data: bytes) -> None:
        name, _, kind, parts = header
        if parts is None and self._extended_header(name, kind, data):
            return
        # A member: the long name and local pax records before it were its own.
        self._long_name = None
        if self._held[1]:
            self._local, self._held[1] = {}, 0
        if parts is None:
            return  # a folder, a link, a device, WebDataset's metadata
        key, extension = parts
        sample = self._sample
        if sample is None or sample["__key__"] != key:
            if sample is not None:
                self._out.append(sample)
            sample = self._sample = {"__key__": key, "__shard__": self.shard}
            self._sample_bytes = len(data)
        elif extension in sample:
            raise self._fail(name, f"is a second {extension!r} in sample {key!r}")
        else:
            self._sample_bytes += max(len(data), BLOCK)
        sample[extension] = data

    def _extended_header(self, name: str, kind: bytes, data: bytes) -> bool:
        """Take in a header that names (or sizes) the member after it; whether it was one."""
        if kind == b"K":  # a long link name: for a link, which is passed over
            return True
        if kind == b"L":
            self._long_name = _text(data)
            return True
        if kind in (b"x", b"g"):
            records = self._pax(name, data)
            # Records add up (the global ones for the whole archive, the local ones until
            # their member), so their bound is on them all, not on each header.
            self._held[kind == b"x"] += len(data)
            if sum(self._held) > self._extended:
                raise self._fail(name, f"has extended headers of over {self._extended} bytes")
            (self._local if kind == b"x" else self._global).update(records)
            return True
        return False

    def _pax(self, name: str, data: bytes) -> dict[str, str]:
        records: dict[str, str] = {}
        at = 0
        while at < len(data) and data[at : at + 1] != b"\0":
            match = _PAX_RECORD.match(data, at)
            length = int(match.group(1)) if match else 0
            end = at + length
            if match is None or length == 0 or end > len(data) or data[end - 1 : end] != b"\n":
                raise self._fail(name, "has a malformed pax record")
            key = match.group(2).decode("utf-8", "surrogateescape")
            records[key] = data[match.end(2) + 1 : end - 1].decode("utf-8", "surrogateescape")
            at = end
        return records

    def _flush_unless(self, parts: tuple[str, str] | None) -> None:
        """Hand over the sample being built before a bad member that is not one of its own."""
        sample = self._sample
        if sample is not None and (parts is None or parts[0] != sample["__key__"]):
            self._out.append(sample)
            self._sample = None

    def _end_archive(self) -> None:
        self._ended = True
        if self._sample is not None:
            self._out.append(self._sample)
            self._sample = None
