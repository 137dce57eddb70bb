"""The proxy each request of :class:`HttpDataset` goes through: the environment's, as curl,
requests and obstore (so :class:`ObjectStoreDataset` too) take it.

``http_proxy`` for ``http`` locations, ``https_proxy`` for ``https`` ones (a tunnel: the proxy
sees the host, never the request), ``all_proxy`` for either when its own is unset, and no
proxy for a host that ``no_proxy`` names (a name, a domain suffix, ``host:port``, ``*``, an
address, or a range of them: ``10.0.0.0/8``, ``fd00::/8``). The standard library reads them
(:func:`urllib.request.getproxies_environment`: lower case first, and ``HTTP_PROXY`` not at
all in a CGI script, where a request's ``Proxy`` header would have set it) and matches the
names; the addresses and ranges, which it does not match (curl, requests and obstore do), are
matched here. They are read once, when the dataset is built. Loopback hosts (``localhost``,
``127.0.0.0/8``, ``::1``, in any spelling the resolver reads: ``::ffff:127.0.0.1``,
``0x7f000001``) are never proxied: a proxy elsewhere cannot reach them. aiohttp
connects to ``http`` and ``https`` proxies only; another (``socks5://``), or a value that is
not a URL, is passed over with a warning, and those requests go direct.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import urllib.request
from typing import TYPE_CHECKING, Any, Final

from ._redact import redact_url

if TYPE_CHECKING:
    import yarl

logger = logging.getLogger("asyncloader")

_KEPT: Final = 4096
"""Hosts whose proxy is remembered at most (redirects may name any number): past it the
record starts again."""


_SAID: set[str] = set()
"""The proxies passed over that a warning named: once each, however many datasets."""


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` names as the resolver reads it (an IPv4 address mapped into IPv6,
    or written as one hexadecimal number, is the IPv4 one), or ``None`` for a name."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _loopback(host: str) -> bool:
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    address = _address(host)
    return address is not None and address.is_loopback


def _networks(no_proxy: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The addresses and ranges in ``no_proxy`` (an IPv6 one with or without brackets)."""
    found = []
    for entry in no_proxy.split(","):
        try:
            found.append(ipaddress.ip_network(entry.strip().strip("[]"), strict=False))
        except ValueError:  # a name: the standard library's to match
            continue
    return found


class Proxies:
    """The environment's proxies, as they were when this was made."""

    def __init__(self) -> None:
        import yarl  # here, as in HttpDataset: aiohttp (and yarl with it) is optional

        self._url = yarl.URL
        found = urllib.request.getproxies_environment()
        self._no = found.get("no", "")
        self._networks = _networks(self._no)
        self._by_scheme: dict[str, yarl.URL] = {}
        for scheme in ("http", "https"):
            given = found.get(scheme) or found.get("all")
            if not given:
                continue
            try:
                proxy = yarl.URL(given if "://" in given else f"http://{given}")
            except ValueError:  # a port out of range, a broken IPv6 address
                shown, why = redact_url(given), "it is not a URL"
            else:
                if proxy.scheme in ("http", "https") and proxy.host:
                    self._by_scheme[scheme] = proxy
                    continue
                shown = redact_url(proxy.with_path(""))
                why = "aiohttp connects to http and https proxies only"
            if shown not in _SAID:
                _SAID.add(shown)
                logger.warning(
                    "the environment's proxy %s is not used (%s): HttpDataset's requests go direct",
                    shown,
                    why,
                )
        self._hosts: dict[tuple[str, str, int | None], yarl.URL | None] = {}

    def for_url(self, url: Any) -> yarl.URL | None:
        """The proxy for a request of ``url`` (a string, or a parsed URL); ``None``: direct."""
        if not self._by_scheme:
            return None
        parsed = url if isinstance(url, self._url) else self._url(url)
        key = (parsed.scheme, parsed.host or "", parsed.explicit_port)
        try:
            return self._hosts[key]
        except KeyError:
            pass
        scheme, host, port = key
        proxy = self._by_scheme.get(scheme)
        if proxy is not None and self._bypassed(host, port):
            proxy = None
        if len(self._hosts) >= _KEPT:
            self._hosts.clear()
        self._hosts[key] = proxy
        return proxy

    def _bypassed(self, host: str, port: int | None) -> bool:
        if _loopback(host):
            return True
        if self._networks:
            address = _address(host)
            if address is not None and any(address in network for network in self._networks):
                return True
        # Names as urllib (and so requests) matches them; the function is in the standard
        # library on every platform, but not in typeshed.
        bypassed: bool = urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]
            host if port is None else f"{host}:{port}", {"no": self._no}
        )
        return bypassed
