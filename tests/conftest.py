"""Shared fixtures: every async test runs on asyncio's loop (debug mode) and on uvloop."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping

import pytest
import uvloop

from .servers import FaultServer, run_fault_server

# An object store opened without keys asks the cloud's instance metadata service for them
# (169.254.169.254): never from a test. Its endpoint is a closed port on 127.0.0.1 instead.
os.environ.setdefault("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

# Every server a test starts is on 127.0.0.1, and obstore and botocore send even those
# requests through the environment's proxy (a developer's behind one): the tests run with
# none, and test_proxies.py sets the ones it means.
for _name in [name for name in os.environ if name.lower().endswith("_proxy")]:
    del os.environ[_name]

# torch is pinned for Python 3.11, the version CI runs, where it must be installed (a missing
# torch fails there). Elsewhere no CPU wheel of it is at hand, so only its tests are left out.
TORCH_MISSING = sys.version_info[:2] != (3, 11) and importlib.util.find_spec("torch") is None
collect_ignore = (
    [
        "test_torch.py",
        "test_examples.py",
        "test_torchrun.py",
        "test_hostile_torch.py",
        "test_lightning.py",
    ]
    if TORCH_MISSING
    else []
)


def pytest_report_header() -> str:
    """Say in the header when the torch tests are not collected, and why."""
    if TORCH_MISSING:
        return "torch tests not collected: no torch 2.13.0 CPU wheel for this Python here"
    return "torch tests collected"


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


@pytest.fixture(scope="module")
def server() -> Iterator[FaultServer]:
    """The aiohttp fault-injection server of :mod:`tests.servers` on 127.0.0.1, one per test
    module (its hit counts are per path, and each test uses paths of its own)."""
    with run_fault_server() as running:
        yield running
