"""What the user's code logs in a worker process, handled by the loader's process.

A worker is a fork of a fresh interpreter: the training script's logging configuration (its
handlers and levels) is not there, where torch's forked workers have it. So the loader's
levels cross as the workers' server starts (:func:`levels`, :func:`follow`), and a worker
whose root logger has no handler once the work is loaded (the work's modules configured none)
keeps each record logged at those levels (:class:`Carrier`) and sends it back with its job's
answer. The loader's process hands it to its own logger of that name (:func:`replay`), whose
handlers write it as theirs, with the worker's process id and name.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import traceback
from typing import Any, Final

Levels = tuple[dict[str, int], int]
"""The levels set on loggers, by name (``""``: the root), and ``logging.disable``'s."""

Record = dict[str, Any]
"""A log record as it crosses: its attributes, its message formatted."""

LIMIT: Final = 1000
"""Records one job carries back at most; those past it are counted, and said to be dropped (a
loop that logs per pixel must not fill the worker's memory)."""

_PLAIN: Final = (str, int, float, bool, type(None))

_FORMAT: Final = logging.Formatter()


def levels() -> Levels:
    """This process's logging levels, for the workers' server to follow."""
    manager = logging.root.manager
    found = {"": logging.root.level}
    for name, logger in list(manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            found[name] = logger.level
    return found, manager.disable


def follow(settings: Levels) -> None:
    """Set the loader's levels here (before the work's modules, which may set their own)."""
    found, disabled = settings
    for name, level in found.items():
        logging.getLogger(name or None).setLevel(level)
    logging.disable(disabled)


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
