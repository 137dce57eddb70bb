"""A ``StopIteration`` out of the user's code ends nothing: it fails its batch.

A ``StopIteration`` (or ``StopAsyncIteration``) that a dataset, a transform or a
``collate_fn`` raises (a ``next()`` on an exhausted iterator, say) would otherwise end
whatever iteration it escapes into: the epoch, silently, as in torch's loader; or, set on an
asyncio future, which refuses it, nothing at all, leaving its batch waiting forever. It
becomes a ``RuntimeError`` that names it, as Python makes of one leaving a generator
(PEP 479).
"""

from __future__ import annotations


def escaped(error: BaseException) -> BaseException:
    """``error``, or the ``RuntimeError`` it becomes if it is a ``StopIteration``."""
    if not isinstance(error, StopIteration | StopAsyncIteration):
        return error
    converted = RuntimeError(
        f"the dataset, transform or collate_fn raised {type(error).__name__}, which cannot "
        "end an epoch: the batch fails instead"
    )
    converted.__cause__ = error
    return converted
