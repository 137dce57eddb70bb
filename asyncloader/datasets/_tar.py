"""WebDataset samples from one tar stream: consecutive members that share a key.

A member ``dir/000123.jpg`` has the key ``dir/000123`` and the extension ``jpg`` (everything
after the first dot of its last component, lower-cased), as WebDataset splits them, so that
``000123.jpg``, ``000123.cls`` and ``000123.json`` become one sample
``{"__key__": "000123", "__shard__": shard, "jpg": b"...", "cls": b"...", "json": b"..."}``.

The stream is read once, front to back, with :mod:`tarfile` in stream mode (``r|*``: plain,
gzip, bzip2 or xz), so nothing but the member being read is held. Every header is hostile: a
member's size is checked against ``max_bytes`` before its data is read, names are only split
(never used as paths), members that are not regular files (links, devices, folders) and
WebDataset's ``__meta__`` files are passed over. A stream that is not a tar, ends early, or
has a member over the limit, a name with no key or no extension, or an extension twice in one
sample, raises :class:`ShardError` naming the shard and the member.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from typing import Any, Final, Protocol, cast

_KEY: Final = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
"""WebDataset's split of a member name into key and extension."""

_BUFSIZE: Final = 1 << 16
"""tarfile's reads of the stream (its default is 10 KiB)."""

_META: Final = re.compile(r"(^|/)__[^/]*__$")


class Readable(Protocol):
    """A shard's bytes, read front to back (a file, a pipe, an object's chunks)."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class ShardError(OSError):
    """A shard could not be read to its end: its remaining samples are lost."""


class ReadFailed(OSError):
    """The shard's bytes could not be read (the request, the connection, the file): raised by
    a shard's reader with a message that names the shard."""


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name, WebDataset's way; ``None`` if it has none."""
    match = _KEY.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def _shown(name: str) -> str:
    """A member name as a message shows it: printable, and short."""
    text = name.encode("unicode_escape", "replace").decode("ascii", "replace")
    return repr(text if len(text) <= 120 else text[:117] + "...")


def samples(fileobj: Readable, shard: str, max_bytes: int | None) -> Iterator[dict[str, Any]]:
    """The samples of one tar stream, in order.

    Args:
        fileobj: The shard's bytes, read front to back.
        shard: How messages (and each sample's ``__shard__``) name the shard.
        max_bytes: The largest member accepted.

    Raises:
        ShardError: The stream is not a tar, ends early, or has a bad member.
    """
    member_name = "(the first header)"
    try:
        with tarfile.open(fileobj=cast(Any, fileobj), mode="r|*", bufsize=_BUFSIZE) as archive:
            sample: dict[str, Any] | None = None
            while (member := archive.next()) is not None:
                # A stream's headers are not kept: memory stays flat over the shard.
                cast(Any, archive).members.clear()
                member_name = member.name
                if not member.isreg() or _META.search(member.name):
                    continue
                parts = split_name(member.name)
                problem = _problem(member, parts, max_bytes)
                if problem is not None:
                    if sample is not None and (parts is None or parts[0] != sample["__key__"]):
                        yield sample  # complete: the bad member is not one of its own
                    raise ShardError(f"shard {shard}: member {_shown(member.name)} {problem}")
                assert parts is not None
                key, extension = parts
                data = archive.extractfile(member)
                assert data is not None  # a regular file has data
                content = data.read()
                if len(content) != member.size:
                    raise ShardError(
                        f"shard {shard}: member {_shown(member.name)} ends early "
                        f"({len(content)} of {member.size} bytes)"
                    )
                if sample is None or sample["__key__"] != key:
                    if sample is not None:
                        yield sample
                    sample = {"__key__": key, "__shard__": shard}
                elif extension in sample:
                    raise ShardError(
                        f"shard {shard}: member {_shown(member.name)}: a second {extension!r} "
                        f"in sample {key!r}"
                    )
                sample[extension] = content
            # tarfile ends quietly at a missing or cut header after the first: only the
            # end-of-archive blocks (zeros) show that the shard was written to its end.
            if archive.fileobj.read(tarfile.BLOCKSIZE) != tarfile.NUL * tarfile.BLOCKSIZE:
                raise ShardError(
                    f"shard {shard}: ends after member {_shown(member_name)} without the "
                    "end-of-archive blocks (cut short, or not tar data after it)"
                )
            if sample is not None:
                yield sample
    except ShardError:
        raise
    except ReadFailed as failed:
        raise ShardError(f"shard {shard}: at member {_shown(member_name)}: {failed}") from None
    except Exception as error:  # tarfile's, and its decompressors' (zlib, lzma, bz2)
        raise ShardError(
            f"shard {shard}: not a readable tar at member {_shown(member_name)} "
            f"({type(error).__name__}: {str(error)[:120]})"
        ) from None


def _problem(
    member: tarfile.TarInfo, parts: tuple[str, str] | None, max_bytes: int | None
) -> str | None:
    """What is wrong with a member's header, if anything."""
    if parts is None:
        return "has no key and extension"
    if max_bytes is not None and member.size > max_bytes:
        return f"is {member.size} bytes, over max_bytes={max_bytes}"
    return None
