"""``ObjectStoreDataset``: objects (or byte ranges of objects) from obstore's stores."""

from __future__ import annotations

import asyncio
import bisect
import datetime
import os
import re
from typing import IO, TYPE_CHECKING, Any, Final

from .._settings import check_timeout
from .._stats import note_retry
from ._file import FileDataset, read_at_most
from ._http import _CHANGED, _check_max_bytes
from ._locations import Locations
from ._origins import Gates
from ._ranges import RangeFile, encoded
from ._redact import redact_text, redact_url
from ._retry import Retry
from ._streaming import STREAM_CHUNK, Blocking, Sink

if TYPE_CHECKING:
    from obstore import GetOptions

_LONGEST_WAIT_S: Final = 10.0**12

SCHEMES: Final = (
    "s3://",
    "s3a://",
    "gs://",
    "az://",
    "abfs://",
    "abfss://",
    "adl://",
    "azure://",
    "http://",
    "https://",
    "file://",
    "memory://",
)


def _pinned(meta: Any) -> GetOptions:
    """The options of a GET of the object ``meta`` describes, and of no other version."""
    options: GetOptions = {}
    if meta.get("e_tag"):
        options["if_match"] = meta["e_tag"]
    if meta.get("version"):
        options["version"] = meta["version"]
    return options


def _retry_config(retry: Retry) -> dict[str, Any]:
    """``retry`` as obstore's own ``RetryConfig``: one retry loop, in the client."""
    return {
        "max_retries": retry.max_retries,
        "backoff": {
            "init_backoff": datetime.timedelta(seconds=retry.initial_backoff),
            "max_backoff": datetime.timedelta(seconds=retry.max_backoff),
            "base": 2,
        },
    }


def open_store(url: str, retry: Retry, timeout: float | None, options: dict[str, Any]) -> Any:
    """Open the obstore store of ``url`` with ``retry`` as its retry config.

    ``allow_http`` and ``timeout`` go to the client options; every other option (``endpoint``,
    ``region``, ``access_key_id``, ``secret_access_key``, ...) to the store's config.
    """
    from obstore.store import from_url

    open_url: Any = from_url  # its overloads are per store kind; the options are checked by it

    if not isinstance(url, str) or not url.startswith(SCHEMES):
        raise ValueError(f"store URL {redact_url(str(url))!r} has no supported scheme {SCHEMES}")
    timeout = check_timeout("timeout", timeout)
    options = dict(options)
    client: dict[str, Any] = {}
    if "allow_http" in options:
        client["allow_http"] = bool(options.pop("allow_http"))
    if timeout is not None:
        # Past what a timedelta holds (about 31,700 years), as long as one can wait.
        client["timeout"] = datetime.timedelta(seconds=min(timeout, _LONGEST_WAIT_S))
    local = url.startswith(("file://", "memory://"))
    try:
        if local:
            return open_url(url, **options)
        return open_url(url, client_options=client, retry_config=_retry_config(retry), **options)
    except Exception as error:  # obstore's config errors may echo the URL or the options
        raise ValueError(f"cannot open store {redact_url(url)!r}: {_clean(error)}") from None


async def _without_markers(store: Any, listed: set[str], empty: list[str]) -> list[str]:
    """``listed``, sorted, less the folder markers among its ``empty`` objects.

    A marker is an empty object whose key ends in "/" (the S3 console, rclone and Hadoop's
    S3A write them for folders); obstore lists it without the slash, and no GET finds it
    then. The prefix's own marker is listed as ``""``, another one is known by the keys under
    it; an empty folder's, by a HEAD that does not find it (an empty object is found).
    """
    import obstore
    from obstore.exceptions import NotFoundError

    keys = sorted(listed)
    markers = set()
    for path in empty:
        under = bisect.bisect_left(keys, path + "/")
        if path == "" or (under < len(keys) and keys[under].startswith(path + "/")):
            markers.add(path)
            continue
        try:
            await obstore.head_async(store, path)
        except (NotFoundError, FileNotFoundError):  # obstore raises either
            markers.add(path)
    return [key for key in keys if key not in markers]


def _local_folder(store: Any, retry: Retry, max_bytes: int | None) -> FileDataset | None:
    """A local store's folder as a :class:`FileDataset`, which reads beneath its root (a
    link out of it fails its item, a FIFO is refused); ``None`` for any other store.

    obstore's ``LocalStore`` follows every link, out of the folder too, and opening a FIFO
    waits for a writer for ever.
    """
    from obstore.store import LocalStore

    if not isinstance(store, LocalStore):
        return None
    root = "/" if store.prefix is None else os.fspath(store.prefix)
    return FileDataset([], root=root, retry=retry, max_bytes=max_bytes)


class _Repeated(Exception):
    """A listing named a key it had named before."""


def _clean(error: BaseException) -> str:
    text = redact_text(str(error))
    return text.splitlines()[0] if text else type(error).__name__


_CREDENTIAL_SOURCES: Final = (
    "/latest/api/token",  # AWS instance metadata (IMDSv2), asked when no keys are given
    "/latest/meta-data/iam",
    "169.254.170.2",  # AWS container credentials
    "/metadata/identity/oauth2/token",  # Azure managed identity
    "computeMetadata/v1",  # GCP metadata server
)
_REFUSED: Final = ("ConnectionRefused", "Connection refused", "tcp connect error", "dns error")
_TIMED_OUT: Final = ("timed out", "TimedOut", "deadline has elapsed", "kind: Timeout")
_OS_MESSAGE: Final = re.compile(r'message: "([^"]{1,200})"')


def _translate(error: Exception, what: str) -> OSError | ValueError:
    """obstore's exception as the loader's contract says: type by cause, message redacted.

    obstore names the cause only in its error's debug text: a retried request's ``retry_timeout``
    setting appears in every retried error, so it is never read as a time-out.
    """
    from obstore.exceptions import (
        NotFoundError,
        PermissionDeniedError,
        UnauthenticatedError,
    )

    text = str(error)
    message = f"{what}: {_clean(error)}"
    found = _OS_MESSAGE.search(text)
    if found:
        message = f"{message} ({found.group(1)})"
    if isinstance(error, NotFoundError | FileNotFoundError):
        return FileNotFoundError(message)
    if isinstance(error, PermissionDeniedError | UnauthenticatedError | PermissionError):
        return PermissionError(message)
    if any(source in text for source in _CREDENTIAL_SOURCES) or "credential" in text.lower():
        return PermissionError(
            f"{what}: credentials were not found (no keys given, none in the environment, and "
            f"no credential service answered): {_clean(error)}"
        )
    if any(marker in text for marker in _REFUSED):
        return ConnectionError(message)
    if any(marker in re.sub(r"retry_timeout: \S+", "", text) for marker in _TIMED_OUT):
        return TimeoutError(message)
    return OSError(message)


class ObjectStoreDataset:
    """An async dataset whose items are objects of an obstore store, as obstore ``Bytes``.

    ``Bytes`` implements the buffer protocol: ``memoryview(item)``, ``np.frombuffer(item)``
    and ``bytes(item)`` work, the first two without a copy.

    A local store (``file://``, ``LocalStore``) is read as :class:`FileDataset` reads its
    ``root``, its items ``bytes``: beneath its folder only (a link that leaves it fails its
    item), regular files only (a FIFO is refused, not waited on).

    Args:
        store: An obstore store, or a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
            ``file://``, ``memory://``), optionally with a prefix the keys are under.
        locations: Keys (a list, a function of the index, or a
            :class:`~asyncloader.Template`), or ``(key, offset, length)`` byte ranges, so many
            samples can live in one large shard object.
        length: The number of items, for a function or a template of scalars only.
        retry: Becomes the store's own retry config when the store is opened from a URL (a
            store passed in keeps its own).
        max_bytes: The largest object accepted: checked from its size (or the range's length)
            before the body is read.
        timeout: Seconds one request may take (a URL's store only).
        **options: Store options for a URL: ``endpoint``, ``region``, ``allow_http``,
            credentials such as ``access_key_id`` and ``secret_access_key``, ...

    Raises:
        ImportError: obstore is not installed (``pip install asyncloader[objectstore]``).
        ValueError: The URL or an option is refused by the store.
    """

    def __init__(
        self,
        store: Any,
        locations: object,
        *,
        length: int | None = None,
        retry: Retry | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> None:
        try:
            import obstore  # noqa: F401
        except ImportError as error:
            raise ImportError(
                "ObjectStoreDataset needs obstore: pip install asyncloader[objectstore]"
            ) from error
        self.retry = retry if retry is not None else Retry()
        if not isinstance(self.retry, Retry):
            raise TypeError(f"retry must be a Retry, got {retry!r}")
        if isinstance(store, str):
            self.store = open_store(store, self.retry, timeout, options)
        elif options or timeout is not None:
            raise TypeError("store options and timeout apply to a store URL, not a store object")
        else:
            self.store = store
        self.locations = Locations(locations, "key", length)
        self.max_bytes = _check_max_bytes(max_bytes)
        self._files = _local_folder(self.store, self.retry, self.max_bytes)
        self._gates = Gates()

    @classmethod
    async def from_prefix(
        cls,
        url: str,
        *,
        retry: Retry | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> ObjectStoreDataset:
        """A dataset of every object under the prefix of ``url``, sorted by key.

        Raises:
            FileNotFoundError: Nothing is under the prefix.
        """
        import obstore

        retry = retry if retry is not None else Retry()
        store = open_store(url, retry, timeout, options)
        failure: Exception | None = None
        listed: set[str] = set()
        empty: list[str] = []
        try:
            # Page by page, each awaited whole (no request is left in flight when it stops).
            async for page in obstore.list(store, chunk_size=1000):
                for meta in page:
                    if meta["path"] in listed:
                        # A store lists each key once: a server that pages without end
                        # (the same token, the same keys) would be read forever.
                        raise _Repeated
                    listed.add(meta["path"])
                    if meta["size"] == 0:
                        empty.append(meta["path"])
        except _Repeated:
            failure = OSError(
                f"LIST {redact_url(url)}: the server lists an object twice (its pages repeat, "
                "so the listing would not end)"
            )
        except Exception as error:
            failure = _translate(error, f"LIST {redact_url(url)}")
        else:
            if not listed:
                failure = FileNotFoundError(f"no object under {redact_url(url)}")
        if failure is not None:
            # The store goes now, not with the failed task's reference cycle at some later
            # collection: a store dropped while the interpreter exits can abort the process.
            del store
            try:
                raise failure
            finally:
                del failure
        try:
            keys = await _without_markers(store, listed, empty)
        except Exception as error:
            del store
            raise _translate(error, f"HEAD {redact_url(url)}") from None
        return cls(store, keys, retry=retry, max_bytes=max_bytes)

    def __len__(self) -> int:
        return len(self.locations)

    async def __getitem__(self, index: int) -> Any:
        gate = self._gates.here() if self._files is None else None
        if gate is None:
            return await self._get(index)
        async with gate:  # obstore opens a connection for each request in flight
            return await self._get(index)

    async def _get(self, index: int) -> Any:
        import obstore

        location = self.locations[index]
        if isinstance(location, tuple):
            key, offset, size = location
            if self.max_bytes is not None and size > self.max_bytes:
                raise ValueError(
                    f"range of {key!r} is {size} bytes, over max_bytes={self.max_bytes}"
                )
            if self._files is not None:
                return await asyncio.to_thread(self._read_range, key, offset, size)
            try:
                return await obstore.get_range_async(self.store, key, start=offset, length=size)
            except Exception as error:
                raise _translate(error, f"GET {key} [{offset}:{offset + size}]") from None
        if self._files is not None:
            return await asyncio.to_thread(self._files.read, location)
        try:
            result = await obstore.get_async(self.store, location)
            if self.max_bytes is not None and result.meta["size"] > self.max_bytes:
                raise ValueError(
                    f"{location!r} is {result.meta['size']} bytes, over max_bytes={self.max_bytes}"
                )
            return await result.bytes_async()
        except ValueError:
            raise
        except Exception as error:
            raise _translate(error, f"GET {location}") from None

    def _read_range(self, key: str, offset: int, size: int) -> bytes:
        assert self._files is not None
        with self._files.open_location(key) as file:
            file.seek(offset)
            return read_at_most(file, size, size)

    async def stream(self, index: int, sink: Sink, blocking: Blocking) -> None:
        """Object ``index``, chunk by chunk into ``sink``: a GET whose body streams in as
        ``sink`` takes it (a byte range is not a shard, and is refused).

        A body cut part way is resumed where it stopped. obstore resumes it within ``retry``
        (a range of the rest, whose ETag must be the first answer's); past those retries, or
        at its client's ``timeout``, which bounds a whole request and runs while ``sink``
        waits (30 s when none is given), a GET of the rest is made here, pinned to the object
        (``If-Match`` its ETag, its version, its size), for as long as each attempt delivers
        bytes (none with ``max_retries=0``).
        """
        import obstore
        from obstore.exceptions import PreconditionError

        location = self.locations[index]
        if isinstance(location, tuple):
            raise ValueError(f"{location!r} is a byte range; a shard is a whole object")
        if self._files is not None:
            await self._files.stream_location(location, sink, blocking)
            return
        what = f"GET {location}"
        delivered, size = 0, 0
        options: GetOptions = {}
        while True:
            try:
                result = await obstore.get_async(self.store, location, options=options)
            except PreconditionError:
                raise OSError(f"{what}: {_CHANGED} (its ETag no longer matches)") from None
            except Exception as error:
                raise _translate(error, what) from None
            if not delivered:
                size = result.meta["size"]
                if self.max_bytes is not None and size > self.max_bytes:
                    raise ValueError(
                        f"{location!r} is {size} bytes, over max_bytes={self.max_bytes}"
                    )
                options = _pinned(result.meta)
            elif result.meta["size"] != size:
                raise OSError(f"{what}: {_CHANGED} ({size} bytes, then {result.meta['size']})")
            start = delivered
            chunks = result.stream(min_chunk_size=STREAM_CHUNK)
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    return
                except Exception as error:
                    if delivered == size:  # cut after its last byte: nothing is missing
                        return
                    if delivered == start or not self.retry.max_retries:
                        # obstore's own retries made no headway either (or none are made)
                        raise _translate(error, what) from None
                    break
                delivered += len(chunk)
                if delivered > size:
                    raise OSError(f"{what}: longer than its {size} bytes")
                await sink(chunk)
            note_retry()
            options["range"] = {"offset": delivered}

    def open_file(self, index: int, loop: object = None) -> RangeFile | IO[bytes]:
        """Object ``index`` as a file read anywhere in it (blocking): each read one range GET
        (a byte range is not a shard, and is refused). Every read is of the version the HEAD
        sized (``If-Match`` its ETag, or its version id): it fails if the object was replaced
        since."""
        location = self.locations[index]
        if isinstance(location, tuple):
            raise ValueError(f"{location!r} is a byte range; a shard is a whole object")
        if self._files is not None:
            return self._files.open_location(location)
        import obstore
        from obstore.exceptions import PreconditionError

        try:
            meta = obstore.head(self.store, location)
        except Exception as error:
            raise _translate(error, f"HEAD {location}") from None
        size: int = meta["size"]
        if self.max_bytes is not None and size > self.max_bytes:
            raise ValueError(f"{location!r} is {size} bytes, over max_bytes={self.max_bytes}")
        etag, version = meta.get("e_tag"), meta.get("version")

        def get(start: int, length: int) -> Any:
            options: GetOptions = {"range": (start, start + length)}
            if etag:
                options["if_match"] = etag
            if version:
                options["version"] = version
            try:
                result = obstore.get(self.store, location, options=options)
                refused = encoded(
                    f"GET {location} [{start}:]", result.attributes.get("Content-Encoding")
                )
                data = result.bytes() if refused is None else None
            except PreconditionError:
                raise OSError(
                    f"GET {location} [{start}:]: {_CHANGED} (its ETag no longer matches the "
                    "one its size was checked with)"
                ) from None
            except Exception as error:
                raise _translate(error, f"GET {location} [{start}:]") from None
            if refused is not None:  # obstore decodes nothing: these are the stored bytes
                raise refused
            return data

        return RangeFile(size, get)

    def __repr__(self) -> str:
        return f"ObjectStoreDataset({len(self)} items)"
