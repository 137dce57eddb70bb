"""Where item ``i`` lives: a list, a function of the index, or a :class:`Template`.

A template is parsed once, when the dataset is built, and rendered per item. Each value is
written according to the target, so that no value can ever leave its component:

- ``url``: percent-encoded (``/``, ``?``, ``#``, ``%`` and the rest become ``%XX``);
- ``path`` and ``key``: written as is, and a value containing ``/``, ``\\``, NUL, or equal to
  ``.`` or ``..`` is refused when the dataset is built.

A rendered template whose values make a ``.`` or ``..`` component (in a URL, also spelled
``%2e``) fails its item.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal
from urllib.parse import quote, unquote, urlsplit

from ._redact import redact_text

Target = Literal["url", "path", "key"]

_FORBIDDEN_IN_COMPONENT = ("/", "\\", "\x00")

_DIGITS_SPEC = re.compile(r"(0[0-9]*)?[dxXob]?")
"""A format spec that writes a non-negative int as ASCII digits (or hex letters) alone: no
sign, fill, alignment, grouping or prefix."""


def out_of_range(index: int, length: int) -> IndexError:
    """The error for an item index outside ``range(length)``."""
    return IndexError(f"index {index} is out of range for {length} items")


def _is_sequence(value: object) -> bool:
    return (
        hasattr(value, "__len__")
        and hasattr(value, "__getitem__")
        and not isinstance(value, str | bytes | bytearray)
    )


_BRACES: Final = re.compile(r"\{(\d+)\.\.(\d+)\}")
"""webdataset's brace range of shards: ``shard-{000000..000099}.tar``."""


_ONE_STRING: Final[dict[Target, str]] = {
    "path": "; for one file: [path]; for a folder's files: sorted(os.listdir(folder)), root=folder",
    "url": "; for one URL: [url]; for numbered ones: a Template",
    "key": (
        "; for one key: [key]; for every key under a prefix: "
        "await ObjectStoreDataset.from_prefix(url)"
    ),
}
"""What to write instead of one location string, by what the locations name."""


def _brace_hint(text: object) -> str:
    """What to write instead of a brace range, if ``text`` has one (webdataset's habit)."""
    found = _BRACES.search(text if isinstance(text, str) else "")
    if found is None:
        return ""
    first, last = found.groups()
    if int(first) != 0:
        instead = "a list of the names"
    else:
        spec = f":0{len(first)}d" if len(first) > 1 else ""
        instead = f"Template with {{index{spec}}} and length={int(last) + 1}, or a list"
    return f"; {found.group(0)} is webdataset's brace range, not expanded here: {instead}"


class Template:
    """A location pattern such as ``"s3://bucket/{split}/{index:08d}.jpg"``.

    ``{index}`` is the item's index; every other field names a column given as a keyword: a
    scalar (the same for every item) or a sequence with one value per item. Format specs
    apply as in :meth:`str.format`; literal braces are doubled (``{{`` and ``}}``).

    Args:
        pattern: The pattern.
        **columns: The named columns.

    Raises:
        ValueError: A malformed pattern, a field without a column, attribute or item access
            in a field, a conversion (``!r``), a bad format spec, sequence columns of
            different lengths, or no field that differs between items (neither ``{index}``
            nor a sequence column: one location for every index).
    """

    def __init__(self, pattern: str, /, **columns: object) -> None:
        if not isinstance(pattern, str):
            raise TypeError(f"Template pattern must be a str, got a {type(pattern).__name__}")
        if "index" in columns:
            raise ValueError("Template: 'index' is the item's index, not a column")
        self.pattern = pattern
        self._shown = repr(redact_text(pattern))
        """The pattern as messages show it: no user, password or query string."""
        shown = self._shown
        self.columns = columns
        try:
            parsed = list(string.Formatter().parse(pattern))
        except ValueError as error:
            raise ValueError(f"Template {shown} is malformed: {error}") from None
        self._parts: list[tuple[str, str | None, str]] = []
        for literal, field, spec, conversion in parsed:
            if field is not None:
                if conversion is not None:
                    raise ValueError(f"Template {shown}: conversions (!{conversion}) are refused")
                if not field.isidentifier():
                    raise ValueError(
                        f"Template {shown}: field {{{field}}} is not a plain name"
                        + _brace_hint(pattern)
                    )
                if field != "index" and field not in columns:
                    raise ValueError(f"Template {shown}: no column named {field!r}")
                if spec and ("{" in spec or "}" in spec):
                    raise ValueError(f"Template {shown}: nested fields in a format spec")
            self._parts.append((literal, field, spec or ""))
        lengths = {len(v) for v in columns.values() if _is_sequence(v)}  # type: ignore[arg-type]
        if len(lengths) > 1:
            raise ValueError(f"Template {shown}: columns of different lengths {sorted(lengths)}")
        self.length: int | None = lengths.pop() if lengths else None
        """The number of items the sequence columns define (``None``: scalars only)."""
        fields = {field for _, field, _ in self._parts if field is not None}
        if not any(f == "index" or _is_sequence(columns[f]) for f in fields):
            raise ValueError(
                f"Template {shown} names one location for every index: it needs {{index}} "
                "or a column with a value per item"
            )
        self._check_specs()

    def _check_specs(self) -> None:
        for _, field, spec in self._parts:
            if field is None:
                continue
            try:
                format(0 if field == "index" else self._value(field, 0), spec)
            except (ValueError, TypeError, IndexError) as error:
                raise ValueError(
                    f"Template {self._shown}: format spec {spec!r} of {{{field}}}: {error}"
                ) from None

    def _value(self, field: str, index: int) -> Any:
        column = self.columns[field]
        return column[index] if _is_sequence(column) else column  # type: ignore[index]

    def digits_pattern(self) -> str | None:
        """The pattern as a :meth:`str.format` string of the index alone, when ``{index}`` is
        its only field and every spec of it writes digits alone; else ``None``.

        Such a location needs no escaping (every target keeps digits and hex letters as they
        are) and its value can make no ``.``/``..`` component, so it is rendered in one call.
        """
        if not all(f in (None, "index") and _DIGITS_SPEC.fullmatch(s) for _, f, s in self._parts):
            return None
        return "".join(
            literal.replace("{", "{{").replace("}", "}}")
            + ("" if field is None else f"{{0:{spec}}}")
            for literal, field, spec in self._parts
        )

    def fields(self) -> set[str]:
        """The column names the pattern uses (without ``index``)."""
        return {field for _, field, _ in self._parts if field not in (None, "index")}

    def render(self, index: int, escape: Callable[[str], str]) -> tuple[str, bool]:
        """The location of item ``index``, each value passed through ``escape``; and whether
        a value could make a ``.``/``..`` component (it has a ``.``, or is empty)."""
        out: list[str] = []
        dotted = False
        for literal, field, spec in self._parts:
            out.append(literal)
            if field is not None:
                value = escape(
                    format(index if field == "index" else self._value(field, index), spec)
                )
                dotted = dotted or not value or "." in value
                out.append(value)
        return "".join(out), dotted

    def refuse_index_chars(self) -> None:
        """Refuse ``{index:c}`` in a path or key: it renders index 47 as ``/``, 0 as NUL."""
        for _, field, spec in self._parts:
            if field == "index" and spec.endswith("c"):
                raise ValueError(
                    f"Template {self._shown}: {{index:{spec}}} renders indices as characters "
                    "('/' or NUL among them), refused in a path or key"
                )

    def check_values(self, length: int) -> None:
        """Refuse, for a path or key target, any value that could leave its component."""
        for _, field, spec in self._parts:
            if field is None or field == "index":
                continue
            column: Any = self.columns[field]
            for value in column if _is_sequence(column) else [column]:
                check_component_value(field, format(value, spec))

    def __repr__(self) -> str:
        return f"Template({self._shown}, columns={sorted(self.columns)})"


def check_component_value(field: str, value: str) -> None:
    """Refuse a path/key value that contains a separator or NUL, or is ``.``/``..``."""
    if any(bad in value for bad in _FORBIDDEN_IN_COMPONENT) or value in (".", ".."):
        raise ValueError(
            f"column {field!r} value {value!r} could leave its path component "
            "(it contains '/', '\\\\' or NUL, or is '.' or '..')"
        )


def _url_escape(value: str) -> str:
    if value.isascii() and value.isalnum():  # what quote() keeps as it is: most values
        return value
    return quote(value, safe="")


def _as_is(value: str) -> str:
    return value


def _dot_components(location: str, target: Target) -> int:
    if target == "url":
        parts = urlsplit(location).path.split("/")
        return sum(unquote(part) in (".", "..") for part in parts)
    return sum(part in (".", "..") for part in location.replace("\\", "/").split("/"))


Location = str | tuple[str, int, int]
"""A URL, a path, a key, or for object stores a ``(key, offset, length)`` byte range."""


class Locations:
    """The locations of a dataset's items, resolved per index.

    Args:
        source: A sequence of locations, a function of the index, or a :class:`Template`.
        target: How template values are written: ``"url"``, ``"path"`` or ``"key"``.
        length: The number of items; needed for a function, and for a template with scalar
            columns only.

    Raises:
        TypeError: ``source`` is of none of the three kinds, or its length is unknown.
        ValueError: A template value could leave its component, or lengths disagree.
    """

    def __init__(self, source: object, target: Target, length: int | None = None) -> None:
        self.target = target
        self._escape = _url_escape if target == "url" else _as_is
        if length is not None and (isinstance(length, bool) or not isinstance(length, int)):
            raise TypeError(f"length must be an int, got {length!r}")
        if length is not None and length < 0:
            raise ValueError(f"length must be at least 0, got {length!r}")
        self._list: Sequence[Location] | None = None
        self._template: Template | None = None
        self._function: Callable[[int], Location] | None = None
        self._dots = 0
        self._digits: str | None = None
        """The template as one format string, when its only value is the index as digits."""
        self._relative: str | None = None
        """A path/key pattern whose literal start is relative: its values may not make it
        absolute (an empty first value before a '/', or ``{index:c}`` rendering one)."""
        if isinstance(source, Template):
            self._template = source
            if source.length is not None and length is not None and source.length != length:
                raise ValueError(f"length={length} but the template's columns have {source.length}")
            resolved = source.length if source.length is not None else length
            if resolved is None:
                raise TypeError("a template with scalar columns only needs length=")
            if target != "url":
                source.check_values(resolved)
                source.refuse_index_chars()  # absolute patterns too: NUL and '/' are indices
            self.length = resolved
            self._digits = source.digits_pattern()
            # The pattern's own '.'/'..' components are the user's; values may add none.
            shape = source.render(0, lambda value: "x")[0]
            self._dots = _dot_components(shape, target)
            if target != "url" and not shape.startswith(("/", "\\")):
                self._relative = redact_text(source.pattern)
        elif isinstance(source, str | bytes):
            raise TypeError(
                "locations must be a list, a function or a Template, not one string"
                + (_brace_hint(source) or _ONE_STRING[target])
            )
        elif _is_sequence(source):
            self._list = list(source)  # type: ignore[call-overload]
            if length is not None and length != len(self._list):
                raise ValueError(f"length={length} but {len(self._list)} locations were given")
            self.length = len(self._list)
        elif callable(source):
            if length is None:
                raise TypeError("locations given as a function of the index need length=")
            self._function = source
            self.length = length
        else:
            raise TypeError(
                f"locations must be a list, a function or a Template, got {type(source).__name__}"
            )

    def __len__(self) -> int:
        return self.length

    @property
    def digits_pattern(self) -> str | None:
        """The template as one format string of the index, when that is its only value and
        it is written as digits alone (:meth:`Template.digits_pattern`); else ``None``."""
        return self._digits

    def __getitem__(self, index: int) -> Location:
        """The location of item ``index``.

        Raises:
            IndexError: ``index`` is out of range.
            ValueError: The location has a ``.`` or ``..`` component.
        """
        if not 0 <= index < self.length:
            raise out_of_range(index, self.length)
        if self._digits is not None:
            rendered = self._digits.format(index)
            if self._relative is not None:
                self._check_relative(index, rendered)
            return rendered
        if self._template is not None:
            rendered, dotted = self._template.render(index, self._escape)
            # Values can only make a '.'/'..' component with a '.' (or an empty value next to
            # a literal '.'): the full check (a URL parse, 5 us) runs only then.
            if dotted and _dot_components(rendered, self.target) > self._dots:
                raise ValueError(
                    f"location of item {index}: its values make a '.' or '..' component"
                )
            if self._relative is not None:
                self._check_relative(index, rendered)
            return rendered
        if self._list is not None:
            location = self._list[index]
        else:
            assert self._function is not None
            location = self._function(index)
        key = location[0] if isinstance(location, tuple) else location
        if not isinstance(key, str):
            path = os.fspath(key) if self.target != "url" and isinstance(key, os.PathLike) else None
            if isinstance(path, str):  # a pathlib path: what glob() gives
                return (path, *location[1:]) if isinstance(location, tuple) else path
            # Its value is not shown: a URL object or bytes may hold a password or signature.
            raise TypeError(
                f"location of item {index} is a {type(key).__name__}, not a str "
                "(pass str(url) for a URL object)"
            )
        return location

    def _check_relative(self, index: int, location: str) -> None:
        """A path or key that the pattern makes relative must stay so (see :meth:`render`)."""
        if location.startswith(("/", "\\")):
            raise ValueError(
                f"location of item {index}: its values make the relative pattern "
                f"{self._relative!r} an absolute path"
            )
