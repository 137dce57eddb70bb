"""``python -m asyncloader demo``: the entry point of the command line."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``demo`` (the only command so far)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "demo":
        print("usage: python -m asyncloader demo [--items N] [--in-flight N]", file=sys.stderr)
        return 2
    from ._demo import main as demo

    return demo(args[1:])


if __name__ == "__main__":
    sys.exit(main())
