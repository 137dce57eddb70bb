"""Templates and locations: parsed once, rendered per item, no value ever leaves its component."""

from __future__ import annotations

import itertools
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncloader import FileDataset, HttpDataset, ObjectStoreDataset, Template
from asyncloader.datasets._locations import Locations, _url_escape

PIECES = [*"/\\\x00.?#%:@ab&=;+ ", "%2e", "%2E", "..", "\u2215", "\u00e9"]
hostile = st.one_of(st.text(max_size=8), st.lists(st.sampled_from(PIECES), max_size=8).map("".join))


@given(value=hostile)
def test_url_values_stay_in_their_component(value: str) -> None:
    locations = Locations(Template("http://host:1/prefix/{v}/suffix", v=[value]), "url")
    if value in (".", ".."):  # would be resolved away by any client: the item fails
        with pytest.raises(ValueError, match="component"):
            locations[0]
        return
    url = locations[0]
    assert isinstance(url, str)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.query, parts.fragment) == ("http", "host:1", "", "")
    segments = parts.path.split("/")
    assert segments[:2] == ["", "prefix"]
    assert segments[-1] == "suffix"
    assert len(segments) == 4
    assert unquote(segments[2]) == value


@pytest.mark.parametrize("target", ["path", "key"])
@given(value=hostile)
def test_path_and_key_values_are_refused_or_stay_in_their_component(
    target: str, value: str
) -> None:
    try:
        locations = Locations(Template("prefix/{v}/suffix", v=[value]), target)  # type: ignore[arg-type]
    except ValueError:
        assert any(bad in value for bad in "/\\\x00") or value in (".", "..")
        return
    location = locations[0]
    assert isinstance(location, str)
    assert location.split("/") == ["prefix", value, "suffix"]
    assert value not in (".", "..")


@given(pattern=st.text(alphabet=st.sampled_from(list("{}ab:0>8d!r.[]index ")), max_size=16))
def test_malformed_templates_only_ever_raise_value_error(pattern: str) -> None:
    try:
        template = Template(pattern, a=["x"])
    except ValueError:
        return
    Locations(template, "url", length=1)[0]  # a template that parses renders


def test_index_format_specs_and_columns_render_per_item() -> None:
    locations = Locations(
        Template("s3://b/{split}/{index:08d}-{name}.jpg", split="train", name=["a", "b"]), "key"
    )
    assert len(locations) == 2
    assert locations[1] == "s3://b/train/00000001-b.jpg"
    assert Locations(Template("{{literal}}/{index}"), "path", length=1)[0] == "{literal}/0"


@pytest.mark.parametrize(
    ("pattern", "columns", "message"),
    [
        ("{nope}", {}, "no column"),
        ("{a.b}", {"a": 1}, "plain name"),
        ("{a[0]}", {"a": 1}, "plain name"),
        ("{a!r}", {"a": 1}, "conversion"),
        ("{index:q}", {}, "format spec"),
        ("{a}{b}", {"a": [1, 2], "b": [1]}, "different lengths"),
        ("{", {}, "malformed"),
        ("}", {}, "malformed"),
        # One location for every index: each was taken, and an epoch read one object N times.
        ("s3://b/train.tar", {}, "one location"),
        ("s3://b/{split}.tar", {"split": "train"}, "one location"),
        ("s3://b/x.tar", {"names": ["a", "b"]}, "one location"),
    ],
)
def test_bad_templates_are_refused_at_construction(
    pattern: str, columns: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Template(pattern, **columns)


def test_values_that_together_make_a_dot_component_fail_their_item() -> None:
    locations = Locations(Template("root/{a}{b}/x", a=[".", "y"], b=[".", "z"]), "url")
    with pytest.raises(ValueError, match=r"'\.' or '\.\.'"):
        locations[0]
    assert locations[1] == "root/yz/x"
    # A '.' the pattern itself holds is the user's own and is kept.
    assert Locations(Template("./data/{index}"), "path", length=1)[0] == "./data/0"


def test_locations_kinds_and_lengths() -> None:
    assert Locations(lambda i: f"k{i}", "key", length=3)[2] == "k2"
    assert Locations(["a", ("b", 0, 4)], "key")[1] == ("b", 0, 4)
    with pytest.raises(IndexError):
        Locations(["a"], "key")[1]
    with pytest.raises(IndexError):
        Locations(["a"], "key")[-1]
    with pytest.raises(TypeError, match="length="):
        Locations(lambda i: "x", "key")
    with pytest.raises(TypeError, match="length="):
        Locations(Template("{a}/{index}", a="scalar"), "key")
    with pytest.raises(TypeError, match="one string"):
        Locations("abc", "key")
    with pytest.raises(ValueError, match="length=3"):
        Locations(["a"], "key", length=3)


@given(st.text())
def test_a_url_value_is_escaped_exactly_as_quote_does(value: str) -> None:
    # The fast path for ASCII letters and digits keeps what quote() would keep.
    assert _url_escape(value) == quote(value, safe="")


DIGIT_SPECS = ["", "d", "08d", "0", "x", "04X", "o", "b"]
"""Specs that write an index as digits alone (the one-call rendering's); others do not."""


def _outcome(locations: Locations, index: int) -> tuple[str, object]:
    try:
        return "ok", locations[index]
    except Exception as error:
        return "error", type(error)


@pytest.mark.parametrize("target", ["url", "path", "key"])
@given(
    literals=st.lists(st.sampled_from([*PIECES, "{{", "}}", "", "/"]), min_size=1, max_size=4),
    specs=st.lists(st.sampled_from([*DIGIT_SPECS, "5", "+d", ",", "c"]), max_size=3),
    index=st.integers(0, 10**7),
)
def test_an_index_written_as_digits_renders_as_the_general_path_does(
    target: str, literals: list[str], specs: list[str], index: int
) -> None:
    # The one-call rendering is taken only where it gives what the general one gives.
    fields = [f"{{index:{spec}}}" for spec in specs]
    pattern = "".join(a + b for a, b in itertools.zip_longest(literals, fields, fillvalue=""))
    try:
        fast = Locations(Template(pattern), target, length=index + 1)  # type: ignore[arg-type]
    except ValueError:
        return
    general = Locations(Template(pattern), target, length=index + 1)  # type: ignore[arg-type]
    general._digits = None
    assert (fast._digits is not None) == all(spec in DIGIT_SPECS for spec in specs)
    assert _outcome(fast, index) == _outcome(general, index)


@pytest.mark.parametrize(
    ("make", "hint"),
    [
        (lambda: FileDataset("/data/train"), "for one file: [path]; for a folder's files"),
        (lambda: HttpDataset("http://h/shard-000000.tar"), "for one URL: [url]"),
        (lambda: ObjectStoreDataset(None, "train/"), "ObjectStoreDataset.from_prefix"),
    ],
)
def test_one_string_as_locations_fails_saying_what_to_write(make: Any, hint: str) -> None:
    # A folder, a prefix or one shard as a string failed as "not one string", saying nothing
    # of how to give one location or a folder's files.
    with pytest.raises(TypeError, match="not one string") as caught:
        make()
    assert hint in str(caught.value)


@pytest.mark.parametrize(
    ("make", "hint"),
    [
        (lambda: HttpDataset("http://h/shard-{000000..000009}.tar"), "{index:06d} and length=10"),
        (lambda: Template("shard-{000000..000099}.tar"), "{index:06d} and length=100"),
        (lambda: FileDataset("/data/shard-{0..7}.tar"), "{index} and length=8"),
        (lambda: Template("shard-{000010..000019}.tar"), "a list of the names"),
    ],
)
def test_webdatasets_brace_range_fails_saying_what_to_write(make: Any, hint: str) -> None:
    # A webdataset user's "shard-{000000..000009}.tar" failed as "not one string" or "not
    # a plain name", saying nothing of the range.
    with pytest.raises((TypeError, ValueError), match="is webdataset's brace range") as caught:
        make()
    assert hint in str(caught.value)
