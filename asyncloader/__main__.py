"""``python -m asyncloader``: the command line (see :mod:`asyncloader._cli`)."""

from __future__ import annotations

from ._cli import run

if __name__ == "__main__":
    run()
