"""Request URLs built without parsing each one, for a template that differs per item only by
digits in the path (``https://host/train/{index:08d}.jpg``).

aiohttp parses every URL given as a string (yarl, about as much Python as the rest of a
request's own bookkeeping). Here the origin is parsed once, and each item's URL is that origin
with the item's path, already in the form a parse would leave it. That holds when the
template's rendered URL is canonical (a parse changes nothing), has no user, query or
fragment, and every character of its path outside the index is one a parse keeps as it is:
then an index, digits or hex letters, changes nothing a parse would touch. Anything else is
parsed as before. The tests check the two against each other for generated patterns.
"""

from __future__ import annotations

import re
import string
from typing import TYPE_CHECKING, Final

from ._locations import Locations, out_of_range

if TYPE_CHECKING:
    import yarl

_KEPT: Final = frozenset(string.ascii_letters + string.digits + "-._~/")
"""Path characters a parse never changes (unreserved ones, and the separator)."""

_FIELD: Final = re.compile(r"\{0:[^{}]*\}")


class PathUrls:
    """``index -> yarl.URL`` for a template's items: its origin with the item's path."""

    __slots__ = ("_length", "_origin", "_path")

    def __init__(self, origin: yarl.URL, path: str, length: int) -> None:
        self._origin = origin
        self._path = path
        self._length = length

    def __call__(self, index: int) -> yarl.URL:
        """Item ``index``'s URL (``IndexError`` out of range, as :class:`Locations`)."""
        if not 0 <= index < self._length:
            raise out_of_range(index, self._length)
        return self._origin.with_path(self._path.format(index), encoded=True)


def path_urls(locations: Locations) -> PathUrls | None:
    """The fast URLs of ``locations``, if they qualify (see the module docstring)."""
    import yarl

    pattern = locations.digits_pattern
    if pattern is None or len(locations) == 0:
        return None
    sample = locations[0]
    assert isinstance(sample, str)
    try:
        parsed = yarl.URL(sample)
    except (ValueError, TypeError):
        return None
    if (
        str(parsed) != sample
        or parsed.scheme not in ("http", "https")
        or not parsed.raw_host
        or parsed.raw_user is not None
        or parsed.raw_password is not None
        or parsed.raw_query_string
        or parsed.raw_fragment
    ):
        return None
    origin = parsed.origin()
    shown = str(origin)
    if "{" in shown or not pattern.startswith(shown + "/"):
        return None
    if not set(_FIELD.sub("", pattern[len(shown) :])) <= _KEPT:
        return None
    return PathUrls(origin, pattern[len(shown) :], len(locations))
