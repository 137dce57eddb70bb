"""Helpers for code that builds on asyncloader, and for its own tests and benchmarks.

:func:`assert_equal_output_after_checkpoint` is the resume guarantee as a test: whatever the
point a job stops at, a fresh loader restored from the state it saved there yields exactly
what the uninterrupted run yielded from that point on. :func:`serve_samples` runs the sample
server (synthetic samples over HTTP on 127.0.0.1, with a fixed latency) the demo and the
benchmark suite read from.
"""

from ._resume_check import (
    assert_equal_output_after_checkpoint as assert_equal_output_after_checkpoint,
)
from ._samples import serve_samples as serve_samples

__all__ = ["assert_equal_output_after_checkpoint", "serve_samples"]
