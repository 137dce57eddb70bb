"""HttpDataset against a real aiohttp server on 127.0.0.1 that injects every kind of fault."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import itertools
import logging
import re
import socket
from typing import Any

import pytest
import yarl
from hypothesis import given
from hypothesis import strategies as st

from asyncloader import DataLoader, HttpDataset, Retry, Template
from asyncloader.datasets._fast_urls import path_urls
from asyncloader.datasets._locations import Locations

from .servers import FaultServer, body

FAST = Retry(max_retries=2, initial_backoff=0.001, max_backoff=0.01)


def fetch(dataset: HttpDataset, index: int = 0) -> Any:
    """One item through a real loader (its own loop thread), or the exception it raised."""
    with DataLoader(dataset, collate_fn=list, num_workers=1) as loader:
        iterator = loader.iter_with_indices()
        for _ in range(index):
            next(iterator)
        try:
            return next(iterator)[1][0]
        except Exception as error:
            return error


def test_items_are_the_bodies_in_order(server: FaultServer) -> None:
    sizes = [0, 1, 100, 70_000, 5]
    data = HttpDataset([f"{server.url}/ok/{n}" for n in sizes])
    with DataLoader(
        data, batch_size=2, collate_fn=list, num_workers=2, item_concurrency=2
    ) as loader:
        items = [item for batch in loader for item in batch]
    assert items == [body(n) for n in sizes]


async def test_async_for_and_template_locations(server: FaultServer) -> None:
    data = HttpDataset(Template(server.url + "/ok/{size}", size=[3, 4, 5]))
    async with DataLoader(data, batch_size=3, collate_fn=list, item_concurrency=3) as loader:
        batches = [batch async for batch in loader]
    assert batches == [[body(3), body(4), body(5)]]


@pytest.mark.parametrize("code", [408, 429, 500, 502, 503, 504])
def test_transient_statuses_are_retried_then_fail_with_the_status_and_attempts(
    server: FaultServer, code: int
) -> None:
    path = f"/status/{code}/exhaust"
    error = fetch(HttpDataset([server.url + path], retry=FAST))
    assert type(error) is OSError
    assert f"HTTP {code}" in str(error)
    assert "after 3 attempts" in str(error)
    assert server.hits[path] == 3


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        (400, OSError),
        (401, PermissionError),
        (403, PermissionError),
        (404, FileNotFoundError),
        (410, FileNotFoundError),
        (501, OSError),
    ],
)
def test_other_statuses_fail_at_once(server: FaultServer, code: int, error_type: type) -> None:
    path = f"/status/{code}/once"
    error = fetch(HttpDataset([server.url + path], retry=FAST))
    assert type(error) is error_type
    assert f"HTTP {code}" in str(error)
    assert "after 1 attempt" in str(error)
    assert server.hits[path] == 1


def test_a_flaky_server_recovers_within_the_retries(server: FaultServer) -> None:
    path = "/flaky/503/2/recover"
    assert fetch(HttpDataset([server.url + path], retry=FAST)) == b"recovered"
    assert server.hits[path] == 3


def test_retry_after_is_honoured_up_to_max_backoff(server: FaultServer) -> None:
    # Retry-After: 3600 is capped at max_backoff (0.01 s), so the retry comes at once.
    path = "/retry-after/3600/capped"
    assert fetch(HttpDataset([server.url + path], retry=FAST)) == b"after"
    assert server.hits[path] == 2


@pytest.mark.parametrize("fault", ["reset", "short"])
def test_resets_and_short_bodies_are_retried(server: FaultServer, fault: str) -> None:
    path = f"/{fault}/k"
    error = fetch(HttpDataset([server.url + path], retry=FAST))
    assert isinstance(error, OSError), error
    assert "after 3 attempts" in str(error)
    assert server.hits[path] == 3


@pytest.mark.parametrize("path", ["/slow/k", "/slow-body/k"])
def test_a_slow_response_or_body_times_out_per_attempt(server: FaultServer, path: str) -> None:
    error = fetch(HttpDataset([server.url + path], retry=Retry(1, 0.001, 0.01), timeout=0.1))
    assert type(error) is TimeoutError
    assert "after 2 attempts" in str(error)
    assert server.hits[path] == 2


def test_connection_refused_is_retried_and_fails_as_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    error = fetch(HttpDataset([f"http://127.0.0.1:{port}/x"], retry=FAST))
    assert isinstance(error, ConnectionError)
    assert "after 3 attempts" in str(error)


def test_max_bytes_refuses_from_content_length_and_cuts_chunked_bodies(server: FaultServer) -> None:
    declared = fetch(HttpDataset([server.url + "/ok/2000"], max_bytes=1000))
    assert type(declared) is ValueError
    assert "Content-Length 2000" in str(declared)
    chunked = fetch(HttpDataset([server.url + "/chunked/1000000/big"], max_bytes=10_000))
    assert type(chunked) is ValueError
    assert server.hits["/chunked/1000000/big"] == 1  # not retried
    assert (
        fetch(HttpDataset([server.url + "/chunked/10000/fits"], max_bytes=10_000)) == b"z" * 10_000
    )
    assert fetch(HttpDataset([server.url + "/ok/1000"], max_bytes=1000)) == body(1000)


def test_redirect_loops_are_bounded(server: FaultServer) -> None:
    error = fetch(HttpDataset([server.url + "/redirect/loop"], max_redirects=3))
    assert type(error) is OSError
    assert "redirects" in str(error)
    # The first request and 3 redirects followed; the 4th redirect fails the item.
    assert server.hits["/redirect/loop"] == 4


@pytest.mark.parametrize("kind", ["list", "template"])
async def test_an_index_out_of_range_is_an_index_error(server: FaultServer, kind: str) -> None:
    data = (
        HttpDataset([server.url + "/ok/0"])
        if kind == "list"
        else HttpDataset(Template(server.url + "/ok/{index}"), length=1)
    )
    assert (data._urls is not None) is (kind == "template")  # the URLs built from the index
    for index in (1, -1):
        with pytest.raises(IndexError, match=f"index {index} is out of range for 1 items"):
            await data[index]
    assert await data[0] == body(0)
    await data.aclose()


@pytest.mark.parametrize("how", ["userinfo", "header"])
def test_no_credential_or_query_string_reaches_messages_or_logs(
    server: FaultServer, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.DEBUG)
    url = server.url + "/status/404/q?token=s3cr3t"
    if how == "userinfo":
        data = HttpDataset([url.replace("http://", "http://user:hunter2@")], retry=FAST)
    else:
        data = HttpDataset([url], headers={"Authorization": "Bearer hunter2"}, retry=FAST)
    error = fetch(data)
    assert isinstance(error, FileNotFoundError)
    text = str(error) + repr(error) + caplog.text
    for secret in ("hunter2", "s3cr3t", "token=", "Bearer", "user:"):
        assert secret not in text
    assert error.__cause__ is None
    assert error.__suppress_context__
    # The credentials did reach the server.
    assert "Authorization" in server.headers_seen[-1]


def test_values_are_percent_encoded_in_urls(server: FaultServer) -> None:
    data = HttpDataset(Template(server.url + "/echo/{name}", name=["a b", "x?y#z", "../up"]))
    with DataLoader(data, batch_size=3, collate_fn=list) as loader:
        assert next(iter(loader)) == [b"a b", b"x?y#z", b"../up"]


def test_a_session_per_loop_closed_with_the_loader(server: FaultServer) -> None:
    data = HttpDataset([server.url + "/ok/1"] * 4)
    loader = DataLoader(data, batch_size=2, collate_fn=list, num_workers=1)
    assert len(list(loader)) == 2
    sessions = [entry.session for entry in data._sessions.values()]
    assert len(sessions) == 1
    loader.close()
    assert all(session.closed for session in sessions)


def test_invalid_settings_fail_at_construction(server: FaultServer) -> None:
    with pytest.raises(ValueError, match="timeout"):
        HttpDataset([server.url], timeout=0)
    with pytest.raises(ValueError, match="max_bytes"):
        HttpDataset([server.url], max_bytes=-1)
    with pytest.raises(TypeError, match="retry"):
        HttpDataset([server.url], retry=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="length="):
        HttpDataset(lambda i: server.url)
    with pytest.raises(ValueError, match="max_retries"):
        Retry(max_retries=-1)
    with pytest.raises(ValueError, match="max_backoff"):
        Retry(initial_backoff=2, max_backoff=1)


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ({"X-Token": "a\r\nInjected: 1"}, "headers['X-Token'] has a control character"),
        ({"X-Token": "a\x00b"}, "headers['X-Token'] has a control character"),
        ({"Bad Name": "v"}, "headers: 'Bad Name' is not a header name"),
        ({"": "v"}, "headers: '' is not a header name"),
        ({"Content-Length": "5"}, "headers['Content-Length'] frames the request"),
        ({"transfer-encoding": "chunked"}, "headers['transfer-encoding'] frames the request"),
        ({"Connection": "close"}, "headers['Connection'] frames the request"),
        # Each was taken, and every item then failed: a 206 for a part, a 304 or a 412.
        ({"Range": "bytes=0-3"}, "headers['Range'] decides what a GET answers"),
        ({"If-None-Match": "*"}, "headers['If-None-Match'] decides what a GET answers"),
        ({"if-modified-since": "x"}, "headers['if-modified-since'] decides what a GET answers"),
        ({"If-Match": '"a"'}, "headers['If-Match'] decides what a GET answers"),
        # Both went out: a server takes one of them, or the two joined.
        ({"X-Api-Key": "a", "x-api-key": "b"}, "headers 'X-Api-Key' and 'x-api-key' are one"),
    ],
)
def test_headers_that_cannot_be_sent_as_they_are_fail_at_construction(
    server: FaultServer, headers: dict[str, str], said: str
) -> None:
    # A control character failed every request instead ("Forbidden control character"); a
    # name with a space, a Content-Length or a Transfer-Encoding went out on every GET: a
    # server that believed them read the next request on the connection as this one's body.
    with pytest.raises(ValueError, match=re.escape(said)) as raised:
        HttpDataset([server.url], headers=headers)
    assert "Injected" not in str(raised.value)  # a value is never echoed: it may be a secret
    # What a user sends on purpose still goes: virtual hosts, non-ASCII values.
    HttpDataset([server.url], headers={"Host": "example.com", "X-Name": "café"})


def test_retry_delays_double_with_jitter_and_honour_retry_after() -> None:
    from asyncloader.datasets._http import _retry_after

    retry = Retry(max_retries=5, initial_backoff=0.1, max_backoff=1.0)
    for attempt, base in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (9, 1.0)]:
        delays = [retry.delay(attempt) for _ in range(200)]
        assert all(base / 2 <= d <= base for d in delays)
        assert len(set(delays)) > 1  # the second half is random
    assert retry.delay(0, retry_after=0.5) == 0.5
    assert retry.delay(0, retry_after=3600) == 1.0
    assert _retry_after("2") == 2.0
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    soon = email.utils.format_datetime(
        datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30), usegmt=True
    )
    assert 25 < (_retry_after(soon) or 0) <= 30
    assert _retry_after("not a date") is None
    assert _retry_after("-1") is None


async def test_one_session_per_loop_for_both_consumption_modes(server: FaultServer) -> None:
    data = HttpDataset([server.url + "/ok/2"] * 4)
    loader = DataLoader(data, batch_size=4, collate_fn=list, num_workers=1)
    assert [batch async for batch in loader] == [[body(2)] * 4]
    assert await asyncio.to_thread(lambda: list(loader)) == [[body(2)] * 4]
    sessions = [entry.session for entry in data._sessions.values()]
    assert len(sessions) == 2  # this loop's and the loader's own
    await loader.aclose()
    assert all(session.closed for session in sessions)


def test_a_forked_child_opens_its_own_session(server: FaultServer) -> None:
    import os
    import warnings

    data = HttpDataset([server.url + "/ok/3"] * 4)
    with DataLoader(data, batch_size=2, collate_fn=list, num_workers=1) as loader:
        assert len(list(loader)) == 2
        with warnings.catch_warnings():  # CPython >= 3.12 warns at fork() with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: a whole epoch through its own loop and session
            ok = [item for batch in loader for item in batch] == [body(3)] * 4
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert len(list(loader)) == 2  # the parent goes on


def test_a_hostile_server_cannot_make_the_loader_hold_more_than_its_limits(
    server: FaultServer,
) -> None:
    from asyncloader.transforms import Decode

    data = HttpDataset(
        [server.url + "/bomb", server.url + "/chunked/100000000/hostile"], max_bytes=2**20
    )
    with DataLoader(data, transform=Decode(), collate_fn=list, num_workers=1) as loader:
        iterator = iter(loader)
        with pytest.raises(ValueError, match="pixels"):  # refused from the header
            next(iterator)
        with pytest.raises(ValueError, match="max_bytes"):  # cut off at 1 MiB of 100 MB
            next(iterator)


URL_PIECES = [*"/-._~aZ09 %?#@:;=&+!$'()*,\u00e9", "..", "%2e", "%41", "%zz", "//", "{{", "}}"]


@given(
    origin=st.sampled_from(["http://127.0.0.1:8080", "https://example.com", "http://h:443"]),
    literals=st.lists(st.lists(st.sampled_from(URL_PIECES), max_size=4).map("".join), max_size=3),
    specs=st.lists(st.sampled_from(["", "d", "06d", "x", "04X", "o", "b", "5", ","]), max_size=3),
    index=st.integers(0, 10**9),
)
def test_a_template_url_built_without_a_parse_is_the_one_a_parse_gives(
    origin: str, literals: list[str], specs: list[str], index: int
) -> None:
    path = "".join(
        a + b
        for a, b in itertools.zip_longest(literals, [f"{{index:{s}}}" for s in specs], fillvalue="")
    )
    try:
        locations = Locations(Template(f"{origin}/{path}"), "url", length=index + 1)
        url = locations[index]
    except ValueError:  # refused, or its values make a '.' component: no URL to build
        return
    urls = path_urls(locations)
    if urls is None:
        return
    assert isinstance(url, str)
    built, parsed = urls(index), yarl.URL(url)
    assert built == parsed
    assert str(built) == str(parsed) == url
    assert (built.scheme, built.raw_host, built.port, built.raw_path_qs) == (
        parsed.scheme,
        parsed.raw_host,
        parsed.port,
        parsed.raw_path_qs,
    )


@pytest.mark.parametrize(
    ("pattern", "built"),
    [
        ("http://127.0.0.1:8080/samples/{index}", True),
        ("https://example.com/train/{index:08d}.jpg", True),
        ("https://example.com/{index:x}/{index}", True),
        ("https://Example.com/{index}", False),  # a parse lowers the host
        ("http://h:80/{index}", False),  # and drops a default port
        ("http://h/a b/{index}", False),
        ("http://h/a%20b/{index}", False),
        ("http://h/a/../{index}", False),
        ("http://h/{index}?part=1", False),
        ("http://h/{index}#top", False),
        ("http://user:secret@h/{index}", False),
        ("http://h{index}.example.com/x", False),  # the index in the host
        ("http://h/{index:5}", False),  # padded with spaces
        ("http://h/{split}/{index}", False),
    ],
)
def test_only_urls_that_a_parse_leaves_as_they_are_are_built_without_one(
    pattern: str, built: bool
) -> None:
    columns = {"split": "train"} if "{split}" in pattern else {}
    dataset = HttpDataset(Template(pattern, **columns), length=3)
    assert (dataset._urls is not None) is built
