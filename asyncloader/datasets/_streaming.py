"""What streaming a shard takes: a sink for its chunks, and a way to make blocking calls.

A dataset that can be a shard source has ``async def stream(index, sink, blocking)``: it
reads item ``index`` front to back and awaits ``sink(chunk)`` for each chunk, in order (the
sink may wait, which is how a reader that is behind holds the stream back), and makes its
blocking calls (a file's reads) with ``await blocking(fn, *args)`` on threads that never keep
the process from exiting.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

STREAM_CHUNK: Final = 1 << 20
"""The most bytes read, or handed to the sink, at once."""

Sink = Callable[[Any], Awaitable[None]]
"""Takes one chunk (``bytes`` or another bytes-like object)."""

Blocking = Callable[..., Awaitable[Any]]
"""``await blocking(fn, *args)``: ``fn(*args)`` on a thread."""
