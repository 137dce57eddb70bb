"""Opening a file for reading so that the file read is the file checked.

Checking a path (``realpath``, ``stat``) and then opening it lets whoever can write inside
``root`` swap a file for a symbolic link in between. So nothing is checked by path: a location
under ``root`` is walked one component at a time from a descriptor of ``root``, each opened
with ``O_NOFOLLOW`` relative to the descriptor of its parent. A symbolic link met on the way is
read and resolved by the walk itself, so it can only lead to a place beneath ``root``; ``..``
steps back to a descriptor the walk already holds, and never above ``root``. The descriptor
returned is then checked (``fstat``) to be a regular file: a FIFO, a device or a socket would
block or read forever. ``O_NONBLOCK`` keeps the ``open`` of a FIFO itself from blocking.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from typing import Final

_MAX_LINKS: Final = 40
"""Symbolic links followed in one walk before it fails with ``ELOOP``, as Linux does."""

_LINK_ERRNOS: Final = frozenset({errno.ELOOP, errno.EMLINK})
"""What ``open`` with ``O_NOFOLLOW`` says of a link (Linux: ``ELOOP``, FreeBSD: ``EMLINK``)."""

_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | _CLOEXEC
_FILE: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_ANY_FILE: Final = os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC

_KINDS: Final = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _components(path: str) -> list[str]:
    """The names to walk; a path that ends in ``/`` or ``/.`` ends in ``.``, so that its last
    name must be a directory, as ``open`` has it."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if parts and path.rsplit("/", 1)[-1] in ("", ".") and "/" in path:
        parts.append(".")
    return parts


def _beneath(real_root: str, path: str) -> str | None:
    """``path`` relative to ``real_root`` if it lies beneath it (lexically), else ``None``."""
    path = os.path.normpath(path)
    if path == real_root:
        return ""
    prefix = real_root if real_root.endswith("/") else real_root + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def _walk(root: str, real_root: str, location: str) -> int:
    """The descriptor of ``location`` opened beneath ``root`` (see the module docstring)."""
    if os.path.isabs(location):
        relative = _beneath(real_root, location)
        if relative is None:
            relative = _beneath(os.path.normpath(os.path.abspath(root)), location)
        if relative is None:
            raise PermissionError(errno.EACCES, "it leaves root", location)
        location = relative
    parts = deque(_components(location))
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "it is root itself", location)
    stack = [os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)]
    links = 0
    try:
        while parts:
            name = parts.popleft()
            if name == ".":  # the name before it was opened as a directory
                continue
            if name == "..":
                if len(stack) == 1:
                    raise PermissionError(errno.EACCES, "it leaves root", location)
                os.close(stack.pop())
                continue
            last = not parts
            try:
                fd = os.open(name, _FILE if last else _DIRECTORY, dir_fd=stack[-1])
            except OSError as error:
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many symbolic links", location) from None
                try:
                    target = os.readlink(name, dir_fd=stack[-1])
                except OSError:
                    if error.errno in _LINK_ERRNOS:  # a link when opened, swapped since
                        parts.appendleft(name)
                        continue
                    # Not a link: the open's own failure.
                    raise _described(error, location, name, stack[-1]) from None
                if os.path.isabs(target):
                    relative = _beneath(real_root, target)
                    if relative is None:
                        raise PermissionError(
                            errno.EACCES, "a symbolic link on its way leaves root", location
                        ) from None
                    while len(stack) > 1:
                        os.close(stack.pop())
                    target = relative
                parts.extendleft(reversed(_components(target)))
                if not parts:  # a link to a directory on the way: "." left over
                    raise IsADirectoryError(errno.EISDIR, "it is a directory", location) from None
                continue
            if last:
                return fd
            stack.append(fd)
        raise IsADirectoryError(errno.EISDIR, "it is a directory", location)
    finally:
        for fd in stack:
            os.close(fd)


def open_regular(location: str, root: str | None, real_root: str | None) -> tuple[int, int]:
    """Open ``location`` for reading; return its descriptor and its size.

    With ``root``, the walk stays beneath it whatever links or races it meets. Without, the
    location is opened as given (a path the user chose). Either way the descriptor must be a
    regular file; the caller owns it and closes it.

    Raises:
        ValueError: The location has a NUL byte.
        PermissionError: The location, or a link on its way, leaves ``root``.
        IsADirectoryError: It is a directory.
        OSError: It is a FIFO, a device or a socket; or the system's own error.
    """
    if "\0" in location:  # os.open's own error would not name it
        raise ValueError(f"location {location[:80]!r} has a NUL byte")
    if root is None or real_root is None:
        try:
            fd = os.open(location, _ANY_FILE)
        except OSError as error:
            raise _described(error, location, location, None) from None
    else:
        fd = _walk(root, real_root, location)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "it is a directory", location)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(info.st_mode, location)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _not_regular(mode: int, location: str) -> OSError:
    kind = next((text for test, text in _KINDS if test(mode)), "not a file")
    return OSError(errno.EINVAL, f"it is {kind}, not a regular file", location)


def _described(error: OSError, location: str, name: str, parent: int | None) -> OSError:
    """``error`` from opening ``name``, or, where ``open`` says only ``ENXIO`` ("No such
    device or address": a socket, or a device without its driver), what the file is. The
    file is looked up again for the message only: nothing is read from it."""
    named = OSError(error.errno, error.strerror, location)  # the location, not one name of it
    if error.errno != errno.ENXIO:
        return named
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=parent is None).st_mode
    except OSError:
        return named
    return _not_regular(mode, location)
