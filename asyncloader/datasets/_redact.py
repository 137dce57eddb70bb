"""Keep credentials and query strings out of every message and log line."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: object) -> str:
    """``url`` (a string, or a parsed URL) without its user, password, query string and
    fragment."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        if ":" in host:  # IPv6
            host = f"[{host}]"
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "<unparsable URL>"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (for messages from a client library)."""
    return _URL.sub(lambda match: redact_url(match.group(0)), text)
