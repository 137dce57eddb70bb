"""Shared fixtures: every async test runs on asyncio's loop (debug mode) and on uvloop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Mapping

import pytest
import uvloop


def _debug_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    return loop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run each async test under asyncio's default loop (debug) and uvloop."""
    return {"asyncio": _debug_loop, "uvloop": uvloop.new_event_loop}


def loader_threads() -> set[threading.Thread]:
    """The threads asyncloader started that are still alive."""
    return {t for t in threading.enumerate() if t.name.startswith("asyncloader")}


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves asyncloader threads running after it closed its loaders."""
    before = loader_threads()
    yield
    leaked = loader_threads() - before
    assert not leaked, f"threads left running: {sorted(t.name for t in leaked)}"
