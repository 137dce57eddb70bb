"""How a worker takes the loader's warning filters (:mod:`asyncloader._logs`), in this process:
the filters as they cross and as they are made again."""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

from asyncloader._logs import reporting, warn_as

from . import proc_data


def test_the_filters_made_again_are_the_loaders_with_plain_strings_matched_whole() -> None:
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.filterwarnings("ignore", message="noisy", category=proc_data.Noisy)
        warnings.filterwarnings("error", category=UserWarning, module=r"tests\.", append=True)
        # As Python's own default filters are: a module named by a plain string, matched whole.
        filters: list[Any] = warnings.filters  # type: ignore[assignment]
        filters.append(("default", None, DeprecationWarning, "__main__", 0))
        # Not a filter as the warnings module makes them (a tuple of categories): passed over.
        filters.append(("ignore", None, (UserWarning,), None, 0))
        settings = reporting()
        warn_as(settings)
        made = list(warnings.filters)
    assert [(action, kind) for action, _, kind, _, _ in made] == [
        ("ignore", proc_data.Noisy),
        ("error", UserWarning),
        ("default", DeprecationWarning),
    ]
    noisy, tests, main = made
    assert isinstance(noisy[1], re.Pattern)
    assert noisy[1].match("NOISY item 3")  # as filterwarnings made it: case ignored
    assert isinstance(tests[3], re.Pattern)
    assert tests[3].match("tests.proc_data")
    assert isinstance(main[3], re.Pattern)
    assert main[3].match("__main__")
    assert not main[3].match("__main__2")


def test_a_filter_whose_category_is_not_imported_is_left_out() -> None:
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("ignore", proc_data.Noisy)
        settings = reporting()
        assert settings.filters == [("ignore", None, ("tests.proc_data", "Noisy"), None, 0)]
        unimported = ("ignore", None, ("no_such_module", "Noisy"), None, 0)
        moved = dataclasses.replace(settings, filters=[unimported, *settings.filters])
        warn_as(moved)
        made = list(warnings.filters)
    assert made == [("ignore", None, proc_data.Noisy, None, 0)]
