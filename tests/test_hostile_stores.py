"""ObjectStoreDataset's errors by cause: a refused connection, credentials not found, a server
that never answers. Each runs in a child process with a hard time-out (a store dropped while
the interpreter exits may abort it), against 127.0.0.1 only."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .children import run_script
from .raw_server import response, run_raw_server

ROOT = Path(__file__).parent.parent

SCRIPT = """
import asyncio, time
from asyncloader import ObjectStoreDataset, Retry

async def main():
    data = ObjectStoreDataset(
        "s3://bucket", ["key"], retry=Retry(2, 0.01, 0.05), allow_http=True, timeout=0.5,
        endpoint={endpoint!r}, region="us-east-1", {credentials}
    )
    started = time.monotonic()
    try:
        await data[0]
    except Exception as error:
        print(type(error).__name__, round(time.monotonic() - started, 1))
        print(error)
    del data

asyncio.run(main())
"""


def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def run_child(script: str, timeout: float = 60) -> list[str]:
    """The lines ``script`` prints, run in a child with no AWS_* from the environment; at
    least two (an error's type and message)."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    )
    lines = result.stdout.splitlines()
    assert len(lines) >= 2, (result.returncode, result.stdout, result.stderr[-2000:])
    return lines


def fetch(endpoint: str, credentials: str) -> list[str]:
    return run_child(SCRIPT.format(endpoint=endpoint, credentials=credentials))


KEYS = 'access_key_id="testing", secret_access_key="testing"'


def test_a_refused_connection_is_a_connection_error() -> None:
    kind, message = fetch(closed_port(), KEYS)[:2]
    assert kind.split()[0] == "ConnectionError", message
    assert "Connection refused" in message
    assert "testing" not in message


def test_missing_credentials_are_a_permission_error_saying_so() -> None:
    metadata = closed_port()
    lines = fetch(closed_port(), f"metadata_endpoint={metadata!r}")
    kind, seconds = lines[0].split()
    assert kind == "PermissionError", lines
    assert "credentials were not found" in lines[1]
    assert float(seconds) < 10  # not one 60 s time-out per item


def test_a_server_that_never_answers_is_a_time_out() -> None:
    with run_raw_server(lambda path, headers: [30.0]) as server:
        kind, message = fetch(server.url, KEYS)[:2]
    assert kind.split()[0] == "TimeoutError", message


ENDLESS_PAGE = b"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
<Name>bucket</Name><Prefix></Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys>
<IsTruncated>true</IsTruncated><NextContinuationToken>again</NextContinuationToken>
<Contents><Key>a.tar</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>
<ETag>"e"</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>
</ListBucketResult>"""

LIST_SCRIPT = """
import asyncio, time
from asyncloader import ObjectStoreDataset

async def main():
    try:
        await ObjectStoreDataset.from_prefix(
            "s3://bucket/", allow_http=True, endpoint={endpoint!r}, region="us-east-1", {keys}
        )
    except Exception as error:
        print(type(error).__name__)
        print(error)

asyncio.run(main())
"""


def test_a_listing_that_pages_without_end_fails_at_its_first_repeat() -> None:
    # A server whose every page says "truncated, go on" with the same token and keys: the
    # listing was read without end (31,000 pages in 5 s, each kept), so the call never came
    # back (the child's 30 s time-out).
    pages: list[str] = []

    def page(path: str, headers: dict[str, str]) -> bytes:
        pages.append(path)
        return response(200, ENDLESS_PAGE, {"Content-Type": "application/xml"})

    with run_raw_server(page) as server:
        lines = run_child(LIST_SCRIPT.format(endpoint=server.url, keys=KEYS), timeout=30)
    assert lines[0] == "OSError", lines
    assert "lists an object twice" in lines[1]
    # Keys are checked a chunk of 1,000 at a time: here that is 1,000 pages of one key each.
    assert len(pages) <= 1000


_PAST_THE_DESCRIPTORS = """
import resource, socket, subprocess, sys, time
import boto3
from asyncloader import DataLoader, ObjectStoreDataset
from tests.epochs import outcomes

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
server = subprocess.Popen(
    [sys.executable, "-m", "moto.server", "-p", str(port)],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
try:
    endpoint = f"http://127.0.0.1:{port}"
    credentials = {
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "region_name": "us-east-1",
    }
    for _ in range(200):
        try:
            client = boto3.client("s3", endpoint_url=endpoint, **credentials)
            client.create_bucket(Bucket="train")
            break
        except Exception:
            time.sleep(0.05)
    keys = [f"k/{i}" for i in range(1024)]
    for key in keys:
        client.put_object(Bucket="train", Key=key, Body=b"x" * 64)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    data = ObjectStoreDataset(
        "s3://train",
        keys,
        endpoint=endpoint,
        allow_http=True,
        access_key_id="testing",
        secret_access_key="testing",
        region="us-east-1",
    )
    with DataLoader(
        data, batch_size=64, num_workers=8, item_concurrency=64, collate_fn=list
    ) as loader:
        got = outcomes(loader, len, Exception)
    print(got == [64] * 16, [o[:200] for o in got if o != 64][:1])
finally:
    server.kill()
"""


@pytest.mark.timeout(120)
def test_more_requests_in_flight_than_descriptors_wait_for_a_connection() -> None:
    # 512 GETs in flight on moto (a server process of its own) under a limit of 256
    # descriptors: obstore opens a connection for each, and past the limit "error sending
    # request" failed batches after its 3 retries.
    result = run_script(_PAST_THE_DESCRIPTORS, timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "[]"]
