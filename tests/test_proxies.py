"""HttpDataset through the environment's proxies (``http_proxy``, ``https_proxy``,
``all_proxy``, ``no_proxy``), as curl, requests and obstore take them.

The proxy is a raw-socket server on 127.0.0.1 that answers requests itself; the locations
name a host that does not resolve (``shards.invalid``), so a request that reached the proxy
cannot have gone anywhere else, and one that went direct fails to connect. The tests run
with no proxy of the environment's (conftest.py): each sets the ones it means.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

import pytest

from asyncloader import DataLoader, HttpDataset, Retry

from .datasets import first_item
from .raw_server import RawServer, response, run_raw_server

NO_RETRY = Retry(max_retries=0)
ELSEWHERE = "http://shards.invalid/train/000001.tar"


@pytest.fixture
def proxy() -> Iterator[RawServer]:
    """A proxy that answers every request itself, ``via proxy``."""
    with run_raw_server(lambda path, headers: response(body=b"via proxy")) as server:
        yield server


@pytest.mark.parametrize(
    ("variable", "scheme"),
    [
        ("http_proxy", "http://"),
        ("HTTP_PROXY", "http://"),
        ("all_proxy", "http://"),
        ("http_proxy", ""),
    ],
    ids=["http_proxy", "HTTP_PROXY", "all_proxy", "host:port"],
)
def test_a_request_goes_through_the_environments_proxy(
    proxy: RawServer, monkeypatch: pytest.MonkeyPatch, variable: str, scheme: str
) -> None:
    monkeypatch.setenv(variable, scheme + proxy.url.removeprefix("http://"))
    assert first_item(HttpDataset([ELSEWHERE], retry=NO_RETRY)) == b"via proxy"
    (target, headers), *_ = proxy.requests
    assert target == ELSEWHERE  # the absolute form a proxy is asked with
    assert headers["host"] == "shards.invalid"


def test_a_loader_reads_its_batches_through_the_proxy(
    proxy: RawServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("http_proxy", proxy.url)
    urls = [f"http://shards.invalid/{index}" for index in range(6)]
    loader = DataLoader(HttpDataset(urls, retry=NO_RETRY), batch_size=None)
    assert list(loader) == [b"via proxy"] * 6
    assert sorted(target for target, _ in proxy.requests) == sorted(urls)


def test_the_proxys_credentials_go_to_it_and_into_no_message(
    proxy: RawServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = proxy.url.removeprefix("http://")
    monkeypatch.setenv("http_proxy", f"http://user:pass-secret@{host}")
    assert first_item(HttpDataset([ELSEWHERE], retry=NO_RETRY)) == b"via proxy"
    expected = base64.b64encode(b"user:pass-secret").decode()
    assert proxy.requests[0][1]["proxy-authorization"] == f"Basic {expected}"
    closed = "127.0.0.1:9"  # the discard port: nothing listens there
    monkeypatch.setenv("http_proxy", f"http://user:pass-secret@{closed}")
    error = first_item(HttpDataset([ELSEWHERE], retry=NO_RETRY))
    assert isinstance(error, ConnectionError), error
    assert "pass-secret" not in str(error)


def test_no_proxy_and_loopback_hosts_go_direct(
    proxy: RawServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("no_proxy", "example.com,.invalid")
    # Direct: the name does not resolve (or, where lookups hang, the request times out).
    error = first_item(HttpDataset([ELSEWHERE], retry=NO_RETRY, timeout=5))
    assert isinstance(error, ConnectionError | TimeoutError), error
    with run_raw_server(lambda path, headers: response(body=b"direct")) as server:
        monkeypatch.delenv("no_proxy")
        assert first_item(HttpDataset([server.url + "/x"], retry=NO_RETRY)) == b"direct"
        port = server.url.rsplit(":", 1)[1]
        assert first_item(HttpDataset([f"http://localhost:{port}/y"], retry=NO_RETRY)) == b"direct"
        assert [target for target, _ in server.requests] == ["/x", "/y"]
    assert proxy.requests == []


@pytest.mark.parametrize("host", ["[::ffff:127.0.0.1]", "0x7f000001", "LOCALHOST"])
def test_every_spelling_of_a_loopback_host_goes_direct(
    proxy: RawServer, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    # A mapped address and a hexadecimal one reach this machine as 127.0.0.1 does; asked of
    # the proxy, they named the proxy's own machine.
    monkeypatch.setenv("http_proxy", proxy.url)
    with run_raw_server(lambda path, headers: response(body=b"direct")) as server:
        port = server.url.rsplit(":", 1)[1]
        url = f"http://{host}:{port}/x"
        assert first_item(HttpDataset([url], retry=NO_RETRY, timeout=5)) == b"direct"
    assert proxy.requests == []


@pytest.mark.parametrize(
    ("url", "no_proxy"),
    [
        ("http://192.0.2.7/x", "example.com, 192.0.2.0/24"),
        ("http://192.0.2.7:8080/x", "192.0.2.7"),
        ("http://[2001:db8::7]/x", "2001:db8::/32"),
        ("http://[2001:db8::7]:8080/x", "[2001:db8::7]"),
    ],
    ids=["ipv4-range", "ipv4", "ipv6-range", "ipv6"],
)
def test_no_proxy_names_addresses_and_ranges_as_curl_requests_and_obstore_read_it(
    proxy: RawServer, monkeypatch: pytest.MonkeyPatch, url: str, no_proxy: str
) -> None:
    # The standard library matches no_proxy's entries as names only: a data server inside
    # no_proxy=10.0.0.0/8 was asked through the proxy, which got its address and path.
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("no_proxy", no_proxy)
    # Direct: the documentation's addresses lead nowhere (or the request times out).
    error = first_item(HttpDataset([url], retry=NO_RETRY, timeout=1))
    assert isinstance(error, ConnectionError | TimeoutError), error
    assert proxy.requests == []
    monkeypatch.setenv("no_proxy", "192.0.3.0/24,2001:db9::/32,192.0.2.8")  # none of them
    assert first_item(HttpDataset([url], retry=NO_RETRY)) == b"via proxy"
    assert [target for target, _ in proxy.requests] == [url]


def test_https_goes_through_a_tunnel_whose_refusal_fails_the_item_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refusing = response(403, reason="Forbidden")
    with run_raw_server(lambda path, headers: refusing) as proxy:
        monkeypatch.setenv("https_proxy", proxy.url)
        monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # not for https
        error = first_item(HttpDataset(["https://shards.invalid/a.tar"], retry=NO_RETRY))
        assert [target for target, _ in proxy.requests] == ["shards.invalid:443"]
    assert isinstance(error, ConnectionError), error
    assert "the proxy refused the tunnel: HTTP 403" in str(error)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("socks5h://user:pass-secret@127.0.0.1:1080", "socks5h://127.0.0.1:1080"),
        ("http://user:pass-secret@127.0.0.1:99999", "it is not a URL"),
    ],
)
def test_a_proxy_that_aiohttp_cannot_use_is_passed_over_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str, said: str
) -> None:
    monkeypatch.setenv("all_proxy", value)
    with caplog.at_level(logging.WARNING, logger="asyncloader"):
        HttpDataset([ELSEWHERE], retry=NO_RETRY)
        HttpDataset([ELSEWHERE], retry=NO_RETRY)  # said once
    (record,) = caplog.records
    assert said in record.getMessage()
    assert "pass-secret" not in record.getMessage()
    with run_raw_server(lambda path, headers: response(body=b"direct")) as server:
        dataset = HttpDataset([server.url + "/x"], retry=NO_RETRY)
        assert first_item(dataset) == b"direct"
