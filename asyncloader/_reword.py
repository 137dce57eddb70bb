"""An exception told more, in its own words where it can be: it keeps its type, traceback and
attributes.

Most exceptions print their one string argument as their message, and that argument can then
be replaced. Others (a type whose ``__str__`` is its own, or that takes other arguments) get a
note instead (PEP 678, Python 3.11 and on), which Python prints after the message.
"""

from __future__ import annotations


def reword(error: BaseException, message: str, note: str) -> None:
    """Give ``error`` the message ``message`` where it prints its argument as its message,
    else add ``note``."""
    plain = type(error).__str__ is BaseException.__str__
    if plain and len(error.args) <= 1 and all(isinstance(a, str) for a in error.args):
        error.args = (message,)
    elif hasattr(error, "add_note"):
        error.add_note(note)
