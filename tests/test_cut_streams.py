"""A shard's stream cut part way (issue 20, point 2: the same retries as any item).

Before session 29 a stream that failed after its first byte was not retried over HTTP (the
bytes already delivered would have come twice), so a connection lost a minute into a
shard of a gigabyte lost the rest of that shard. It is now resumed where it stopped, with a
``Range`` request pinned to the object the first response was of (``If-Match`` its strong
ETag, and its size and ETag compared), within the dataset's retries, or fails for good
saying why. The servers here are raw sockets that cut each answer where a test says.
"""

from __future__ import annotations

import gzip
import io
import random
import re
import tarfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader import DataLoader, HttpDataset, ObjectStoreDataset, Retry, TarShards

from .cutting_proxy import CuttingProxy, run_cutting_proxy
from .datasets import streamed
from .raw_server import response, run_raw_server
from .servers import run_moto
from .test_shards import CREDENTIALS

DATA = random.Random(0).randbytes(60_000)
FAST = Retry(max_retries=3, initial_backoff=0.001, max_backoff=0.001)
STRONG = '"v1"'


def answer(
    headers: dict[str, str],
    end: int | None = None,
    data: bytes = DATA,
    etag: str | None = STRONG,
    more: dict[str, str] | None = None,
) -> bytes:
    """What a server that serves ranges answers: from ``Range: bytes=a-`` on (206), or the
    whole object (200), its body cut at byte ``end`` of the object (the connection closes
    there, ``Content-Length`` saying more), with the headers ``more``."""
    fields = {} if etag is None else {"ETag": etag}
    asked = re.fullmatch(r"bytes=(\d+)-", headers.get("range", ""))
    start = 0 if asked is None else int(asked.group(1))
    if asked is not None:
        fields["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
    fields["Content-Length"] = str(len(data) - start)
    return response(200 if asked is None else 206, data[start:end], {**fields, **(more or {})})


def scripted(*replies: Callable[[dict[str, str]], bytes]) -> Callable[[str, dict[str, str]], bytes]:
    """A handler giving the ``k``-th request the ``k``-th reply (the last one thereafter)."""
    count = 0

    def handler(path: str, headers: dict[str, str]) -> bytes:
        nonlocal count
        count += 1
        return replies[min(count, len(replies)) - 1](headers)

    return handler


def read(dataset: Any, pause: float = 0.0) -> tuple[Any, bytes]:
    """How ``dataset``'s stream ended (``None``, or its error) and the bytes it gave."""
    ended, chunks = streamed(dataset, pause)
    return ended, b"".join(chunks)


def cut_at(end: int) -> Callable[[dict[str, str]], bytes]:
    return lambda headers: answer(headers, end)


def whole(headers: dict[str, str]) -> bytes:
    return answer(headers)


@pytest.mark.parametrize("etag", [STRONG, 'W/"v1"', None])
def test_a_stream_cut_part_way_is_resumed_from_the_byte_it_stopped_at(etag: str | None) -> None:
    replies = [lambda h, end=end: answer(h, end, etag=etag) for end in (20_000, 45_000)]
    with run_raw_server(scripted(*replies, lambda h: answer(h, etag=etag))) as server:
        ended, got = read(HttpDataset([server.url + "/shard.tar"], retry=FAST))
    assert ended is None
    assert got == DATA
    asked = [headers for _, headers in server.requests]
    assert [h.get("range") for h in asked] == [None, "bytes=20000-", "bytes=45000-"]
    # Pinned to the first answer's object: If-Match where its ETag is a strong one (a
    # weak one never matches), and the bytes as stored (a range of an encoded body is
    # of the encoded bytes).
    pinned = STRONG if etag == STRONG else None
    assert [h.get("if-match") for h in asked[1:]] == [pinned, pinned]
    assert all(h.get("accept-encoding") == "identity" for h in asked[1:])


@settings(max_examples=40, deadline=None)
@given(
    cuts=st.lists(st.integers(0, len(DATA) - 1), max_size=6).map(sorted),
    retries=st.integers(0, 3),
    etag=st.sampled_from([STRONG, 'W/"v1"', None]),
)
def test_a_stream_is_resumed_while_its_attempts_deliver_bytes(
    cuts: list[int], retries: int, etag: str | None
) -> None:
    # The k-th answer ends at byte cuts[k] of the object; one that ends where the last did
    # delivered nothing. Only attempts in a row that deliver nothing run the retries out
    # (the one that delivered counts as the first of them), so a long stream over a
    # flaky network is never lost to cuts spread over it.
    replies = [lambda h, end=end: answer(h, end, etag=etag) for end in cuts]
    retry = Retry(max_retries=retries, initial_backoff=0.001, max_backoff=0.001)
    with run_raw_server(scripted(*replies, lambda h: answer(h, etag=etag))) as server:
        ended, got = read(HttpDataset([server.url + "/x"], retry=retry))
    at, attempts, answers = 0, 0, len(cuts) + 1
    for k, end in enumerate(cuts):
        attempts = 1 if end > at else attempts + 1
        at = end
        if attempts > retries:
            answers = k + 1
            break
    if answers > len(cuts):
        assert ended is None
        assert got == DATA
    else:
        assert isinstance(ended, OSError), ended
        assert f"(after {attempts} attempt" in str(ended)
        assert got == DATA[:at]
    ranges = [headers.get("range") for _, headers in server.requests]
    resumed = [f"bytes={end}-" if end else None for end in cuts]
    assert ranges == [None, *resumed[: answers - 1]]


OTHERWISE: dict[str, tuple[Callable[[dict[str, str]], bytes], str]] = {
    "200 whole": (
        lambda h: answer({}),
        "HTTP 200, not the range asked for (the server does not serve byte ranges)",
    ),
    "another range": (
        lambda h: answer({"range": "bytes=0-"}),
        "the server sent 'bytes 0-59999/60000' for 'bytes=20000-'",
    ),
    "a range past the end": (
        lambda h: answer(h, more={"Content-Range": "bytes 20000-70000/70001"}),
        "the object changed while it was read (60000 bytes, ETag '\"v1\"' before, 70001",
    ),
    "another ETag": (
        lambda h: answer(h, etag='"v2"'),
        "the object changed while it was read",
    ),
    "412": (lambda h: response(412), "HTTP 412, the object changed while it was read"),
    "another size, no ETag": (
        lambda h: answer(h, data=DATA + b"more", etag=None),
        "the object changed while it was read (60000 bytes, no ETag before, 60004",
    ),
    "encoded": (
        lambda h: answer(h, more={"Content-Encoding": "gzip"}),
        "stored with Content-Encoding 'gzip'",
    ),
    "more than the rest": (
        lambda h: answer(h, more={"Content-Length": "40010"}) + bytes(10),
        "Content-Length 40010 for a range of 40000 bytes",
    ),
    "chunked, longer than the rest": (
        lambda h: chunked(answer(h), b"more") + b"0\r\n\r\n",
        "longer than its 60000 bytes",
    ),
}


def chunked(reply: bytes, *more: bytes) -> bytes:
    """``reply`` with a chunked body (its body, then ``more``, a chunk each), not ended."""
    head, body = reply.split(b"\r\n\r\n", 1)
    head = re.sub(rb"\r\nContent-Length: \d+", b"\r\nTransfer-Encoding: chunked", head)
    chunks = [b"%x\r\n%s\r\n" % (len(part), part) for part in (body, *more)]
    return head + b"\r\n\r\n" + b"".join(chunks)


@pytest.mark.parametrize("case", sorted(OTHERWISE))
def test_a_resumed_read_answered_otherwise_fails_the_stream_for_good(case: str) -> None:
    # Each would have given bytes of another object, or of another place in it, after the
    # first 20,000: the stream fails there, not worth another attempt.
    reply, message = OTHERWISE[case]
    first = cut_at(20_000)
    if case == "another size, no ETag":
        first = lambda h: answer(h, 20_000, etag=None)  # noqa: E731
    with run_raw_server(scripted(first, reply)) as server:
        ended, got = read(HttpDataset([server.url + "/x"], retry=FAST))
    assert isinstance(ended, OSError), ended
    assert message in str(ended)
    # Chunked, the rest came whole before the bytes past the object's end.
    assert got == (DATA if case.startswith("chunked") else DATA[:20_000])
    assert len(server.requests) == 2


UNPINNED: dict[str, Callable[[dict[str, str]], bytes]] = {
    # aiohttp hands over a gzip body decoded: its bytes are not the stored ones a range
    # counts, so a place in it cannot be asked for.
    "gzip": lambda h: response(
        body=gzip.compress(DATA, mtime=0)[:20_000],
        headers={"Content-Encoding": "gzip", "Content-Length": "60100"},
    ),
    # No size: a resumed read could not be checked to be of the same object.
    "chunked": lambda h: response(
        body=b"%x\r\n" % len(DATA) + DATA[:20_000],
        headers={"Transfer-Encoding": "chunked"},
        length=False,
    ),
}


@pytest.mark.parametrize("case", sorted(UNPINNED))
def test_a_stream_with_no_place_to_resume_from_is_not_retried_once_it_gave_bytes(
    case: str,
) -> None:
    with run_raw_server(scripted(UNPINNED[case], whole)) as server:
        ended, got = read(HttpDataset([server.url + "/x"], retry=FAST))
    assert isinstance(ended, OSError), ended
    assert "(after 1 attempt)" in str(ended)
    assert 0 < len(got) < len(DATA)
    assert len(server.requests) == 1


def test_a_chunked_range_that_ends_short_is_resumed_again() -> None:
    # Chunked, a range ends where its last chunk does: short of the object, it is a cut.
    def short(headers: dict[str, str]) -> bytes:
        return chunked(answer(headers, 30_000)) + b"0\r\n\r\n"

    with run_raw_server(scripted(cut_at(20_000), short, whole)) as server:
        ended, got = read(HttpDataset([server.url + "/x"], retry=FAST))
    assert ended is None
    assert got == DATA
    ranges = [headers.get("range") for _, headers in server.requests]
    assert ranges == [None, "bytes=20000-", "bytes=30000-"]


def test_a_stream_cut_before_its_first_byte_is_tried_again_whole() -> None:
    with run_raw_server(scripted(cut_at(0), whole)) as server:
        ended, got = read(HttpDataset([server.url + "/x"], retry=FAST))
    assert ended is None
    assert got == DATA
    assert [headers.get("range") for _, headers in server.requests] == [None, None]


# Object stores: obstore (object_store 0.12 on) resumes a cut GET itself, with a range of the
# rest whose ETag must be the first answer's, within the store's retries (the dataset's
# `retry`). These hold that contract through a proxy in front of moto that cuts the
# connection part way through a shard.


def on_moto(endpoint: str, keys: list[str], retries: int, **settings: Any) -> ObjectStoreDataset:
    """``keys`` of the bucket ``shards`` of the S3 server at ``endpoint``."""
    retry = Retry(max_retries=retries, initial_backoff=0.001, max_backoff=0.001)
    return ObjectStoreDataset(
        "s3://shards", keys, endpoint=endpoint, allow_http=True, retry=retry, **settings
    )


def shard(name: int, count: int = 40) -> bytes:
    """A shard of ``count`` samples of 4 KiB, keys ``{name}-{i:03d}``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for i in range(count):
            data = random.Random(f"{name}-{i}").randbytes(4096)
            info = tarfile.TarInfo(f"{name}-{i:03d}.bin")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def through(proxy: CuttingProxy, retries: int) -> TarShards:
    store = on_moto(proxy.url, ["0.tar", "1.tar", "2.tar"], retries, **CREDENTIALS)
    return TarShards(store, interleave=1)


def outcomes(shards: TarShards) -> list[str]:
    """Each sample's key, or ``error: ...`` in the place of a shard that failed."""
    out: list[str] = []
    with DataLoader(shards, batch_size=None, collate_fn=None) as loader:
        batches = iter(loader)
        while True:
            try:
                sample = next(batches)
            except StopIteration:
                return out
            except OSError as error:
                out.append(f"error: {error}")
            else:
                out.append(sample["__key__"])


def keys_of(name: int, count: int = 40) -> list[str]:
    return [f"{name}-{i:03d}" for i in range(count)]


def cut_shards(
    cuts: int, retries: int, replace: bool = False
) -> tuple[list[str], list[tuple[str, str | None]]]:
    """The outcomes of three shards on moto, of which the first ``cuts`` GETs of shard 1
    are cut 60,000 bytes in (and the shard replaced by another at the cut, with
    ``replace``), and the GETs of shard 1 that the proxy saw (each request line and range)."""
    objects = {f"{n}.tar": shard(n) for n in range(3)}
    with run_moto("shards", objects) as moto:

        def replaced() -> None:
            moto.client.put_object(Bucket="shards", Key="1.tar", Body=shard(9))

        on_cut = replaced if replace else None
        with run_cutting_proxy(moto.port, "/shards/1.tar", cuts, 60_000, on_cut) as proxy:
            got = outcomes(through(proxy, retries))
    return got, [r for r in proxy.requests if r[0].startswith("GET /shards/1.tar")]


def assert_shard_1_failed_alone(got: list[str]) -> None:
    errors = [o for o in got if o.startswith("error")]
    assert len(errors) == 1
    assert "1.tar" in errors[0]
    samples = [o for o in got if not o.startswith("error")]
    assert samples[:40] == keys_of(0)
    assert samples[-40:] == keys_of(2)


def test_an_object_store_shard_cut_part_way_is_resumed() -> None:
    got, gets = cut_shards(cuts=2, retries=3)
    assert got == keys_of(0) + keys_of(1) + keys_of(2)
    assert len(gets) == 3
    assert gets[0][1] is None
    assert all(ranged is not None and not ranged.startswith("bytes=0-") for _, ranged in gets[1:])


def test_an_object_store_shard_cut_past_its_retries_fails_alone() -> None:
    got, gets = cut_shards(cuts=10, retries=2)
    assert_shard_1_failed_alone(got)
    assert len(gets) == 3


def test_an_object_store_shard_replaced_at_its_cut_fails_and_mixes_no_versions() -> None:
    got, _ = cut_shards(cuts=1, retries=3, replace=True)
    assert_shard_1_failed_alone(got)
    assert not any(o.startswith("9-") for o in got)


def test_an_object_store_stream_read_slowly_outlives_its_requests_timeout() -> None:
    # obstore's `timeout` bounds a whole request, its body included, and runs while the
    # reader waits (30 s when none is given). A shard read slower than that was cut at each
    # timeout and resumed by obstore within its retries, then failed (TimeoutError): with
    # the defaults, any shard read for more than about two minutes. A cut after bytes came
    # is now resumed here for as long as each attempt delivers some.
    data = random.Random(1).randbytes(8 << 20)
    with run_moto("shards", {"big": data}) as moto:
        store = on_moto(moto.endpoint, ["big"], 1, timeout=1.0, **CREDENTIALS)
        # The reader is slow: the request's time runs on while it waits.
        ended, got = read(store, pause=0.35)
    assert ended is None
    assert got == data


def test_an_object_store_object_replaced_while_streamed_fails_its_resumption() -> None:
    data = random.Random(2).randbytes(3 << 20)
    with run_moto("shards", {"big": data}) as moto:

        def replace() -> None:
            moto.client.put_object(Bucket="shards", Key="big", Body=bytes(len(data)))

        with run_cutting_proxy(moto.port, "/shards/big", 1, (3 << 20) // 2, replace) as proxy:
            store = on_moto(proxy.url, ["big"], 3, **CREDENTIALS)
            ended, got = read(store)
    assert isinstance(ended, OSError), ended
    assert "changed while it was read" in str(ended)
    assert 0 < len(got) < len(data)
    assert got == data[: len(got)]
