"""What the user's code logs or warns in a worker process, handled as in the loader's.

A worker is a fork of a fresh interpreter: the training script's logging configuration (its
handlers and levels) and its warning filters are not there, where torch's forked workers have
them. So the loader's process says how it reports (:func:`reporting`) as the workers' server
starts: the server takes its logging levels, and its ``faulthandler`` (a worker's crash then
dumps its Python traceback on stderr), before it imports anything (:func:`follow`), and
each worker its warning filters once the work's modules are imported (:func:`warn_as`), and
sends warnings to logging where the loader's process does (``logging.captureWarnings``). A
worker whose root logger has no handler once the work is loaded (the work's modules configured
none) keeps each record logged at those levels (:class:`Carrier`) and sends it back with its
job's answer. The loader's process hands it to its own logger of that name (:func:`replay`),
whose handlers write it as theirs, with the worker's process id and name.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import pickle
import re
import sys
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Final

Filter = tuple[str, str | None, tuple[str, str], str | None, int]
"""A warning filter as it crosses: its action, message pattern, category (by module and
name: resolved where that module is imported), module pattern and line."""

Record = dict[str, Any]
"""A log record as it crosses: its attributes, its message formatted."""

LIMIT: Final = 1000
"""Records one job carries back at most; those past it are counted, and said to be dropped (a
loop that logs per pixel must not fill the worker's memory)."""

_PLAIN: Final = (str, int, float, bool, type(None))

_FORMAT: Final = logging.Formatter()


@dataclass(frozen=True)
class Reporting:
    """How a process reports what code logs and warns, for a worker to do the same."""

    levels: dict[str, int]
    """The levels set on loggers, by name (``""``: the root)."""
    disabled: int
    """``logging.disable``'s level."""
    filters: list[Filter]
    """The warning filters, first first."""
    captured: bool
    """Whether warnings go to logging (``logging.captureWarnings(True)``)."""
    faults: bool
    """Whether ``faulthandler`` is enabled."""


def _pattern(field: Any) -> str | None:
    """A filter's message or module as a pattern: a string there (as Python's own default
    filters have) matches itself whole, as ``-W``'s are made to."""
    if field is None or isinstance(field, str):
        return None if field is None else re.escape(field) + r"\Z"
    return str(field.pattern)


def reporting() -> Reporting:
    """How this process reports, for its workers to follow."""
    manager = logging.root.manager
    levels = {"": logging.root.level}
    for name, logger in list(manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels[name] = logger.level
    filters: list[Filter] = []
    for action, message, kind, module, line in list(warnings.filters):
        if not isinstance(kind, type):  # not a filter as the warnings module makes them
            continue
        category = (kind.__module__, kind.__qualname__)
        with contextlib.suppress(AttributeError):  # a pattern of no kind it makes: passed over
            filters.append((action, _pattern(message), category, _pattern(module), line))
    captured = warnings.showwarning is getattr(logging, "_showwarning", None)
    return Reporting(levels, manager.disable, filters, captured, faulthandler.is_enabled())


def follow(settings: Reporting) -> None:
    """Take the loader's logging levels here (before the work's modules, which may set
    their own), and its ``faulthandler``, to stderr (where it wrote cannot cross)."""
    for name, level in settings.levels.items():
        logging.getLogger(name or None).setLevel(level)
    logging.disable(settings.disabled)
    if settings.faults and not faulthandler.is_enabled():
        with contextlib.suppress(Exception):  # no stderr to write to
            faulthandler.enable(all_threads=True)


def _category(module: str, name: str) -> type[Warning] | None:
    """A warning category by name, if its module is imported here (none imports one: a
    filter must not pull torch into a worker that does not need it)."""
    found: Any = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) and issubclass(found, Warning) else None


def warn_as(settings: Reporting) -> None:
    """Take the loader's warning filters here, and send warnings to logging where it does.
    A filter whose category's module is not imported here is left out."""
    warnings.resetwarnings()
    for action, message, (module, name), where, line in settings.filters:
        category = _category(module, name)
        if category is not None:
            warnings.filterwarnings(
                action,  # type: ignore[arg-type]
                message or "",
                category,
                where or "",
                line,
                append=True,
            )
    if settings.captured:
        logging.captureWarnings(True)


def _shown(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__qualname__}>"


def _portable(record: logging.LogRecord) -> Record:
    """``record`` as it crosses, as ``logging.handlers.SocketHandler`` sends one: its message
    formatted (its arguments may not pickle), its exception as text, and any attribute of an
    ``extra`` that cannot be pickled as its ``repr``."""
    if record.exc_info and not record.exc_text:
        record.exc_text = _FORMAT.formatException(record.exc_info)
    fields = dict(record.__dict__)
    fields.update(msg=record.getMessage(), args=None, exc_info=None)
    fields.pop("message", None)
    for key, value in fields.items():
        if not isinstance(value, _PLAIN):
            try:
                pickle.dumps(value, protocol=5)
            except Exception:
                fields[key] = _shown(value)
    return fields


class Carrier(logging.Handler):
    """A worker's root handler: it keeps the records logged there for the job's answer."""

    def __init__(self) -> None:
        super().__init__()
        self._kept: list[Record] = []
        self._dropped = 0

    @classmethod
    def install(cls) -> Carrier | None:
        """A carrier on the root logger, unless the work's modules configured a handler
        there (their records are then theirs to write, not to be written twice)."""
        if logging.root.handlers:
            return None
        carrier = cls()
        logging.root.addHandler(carrier)
        return carrier

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = _portable(record)
        except Exception:  # a message whose arguments do not fit it: as logging says so
            self.handleError(record)
            return
        if len(self._kept) < LIMIT:
            self._kept.append(fields)
        else:
            self._dropped += 1

    def take(self) -> list[Record]:
        """The records kept since the last call."""
        self.acquire()
        try:
            kept, dropped = self._kept, self._dropped
            self._kept, self._dropped = [], 0
        finally:
            self.release()
        if dropped:
            note = logging.LogRecord(
                "asyncloader",
                logging.WARNING,
                __file__,
                0,
                f"{dropped} records logged in one job past its first {LIMIT} were dropped",
                None,
                None,
            )
            kept.append(_portable(note))
        return kept


def replay(records: list[Record]) -> None:
    """Handle records a worker sent, as this process's loggers of their names would."""
    for fields in records:
        record = logging.makeLogRecord(fields)
        logger = logging.getLogger(record.name)
        try:
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)
        except Exception:  # a filter of the user's that raises must not end the caller
            with contextlib.suppress(Exception):
                traceback.print_exc()
