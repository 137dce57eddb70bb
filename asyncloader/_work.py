"""The loader's work as its worker processes get it: pickled once, when the loader is built,
into sealed anonymous memory that the zygote maps and loads, once, for the workers it forks
(no copy through a socket, no buffer of it in a worker; large arrays in it shared, not
loaded), with the modules it refers to (what the zygote imports); what cannot be pickled is
named, down to the attribute.

Every worker, one that takes a dead one's place too, starts from the same bytes: the work as
it was when the loader was built, whatever the loader's own process did with the dataset
since; but an array that maps a file is that file as it is, as in the loader's process.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import pickle
import sys
import weakref
from collections.abc import Callable
from types import FunctionType
from typing import IO, Any, Final

from ._file_mapped import FileMaps
from ._shared import anonymous, tensor_reduction
from ._worker import Layout, Work
from ._zygote import importing_main, main_source

_SEALS: Final = (
    getattr(fcntl, "F_SEAL_WRITE", 0)
    | getattr(fcntl, "F_SEAL_GROW", 0)
    | getattr(fcntl, "F_SEAL_SHRINK", 0)
    | getattr(fcntl, "F_SEAL_SEAL", 0)
)
"""Once written, nobody changes it: a worker that goes wrong cannot spoil its successors'."""


def _unpicklable(value: object, path: str, depth: int = 0) -> str:
    """The attribute path of ``value`` where pickling fails (the deepest one found)."""
    attributes = getattr(value, "__dict__", None)
    if depth < 4 and isinstance(attributes, dict):
        for name, attribute in attributes.items():
            try:
                pickle.dumps(attribute, protocol=5)
            except Exception:
                return _unpicklable(attribute, f"{path}.{name}", depth + 1)
    return path


class _Unfiled(TypeError):
    """The work refers by name to what the main module defines, and no worker can import it."""


def _dump(
    work: Work,
    file: IO[bytes],
    buffer_callback: Callable[[pickle.PickleBuffer], Any],
    maps: FileMaps,
) -> set[str]:
    """Pickle ``work`` into ``file`` (out-of-band buffers to ``buffer_callback``); the modules
    it refers to.

    Raises:
        TypeError: Part of it cannot be pickled, or refers by name to what the main module
            defines where no worker can import that module; the message names the part and
            attribute, or the name.
    """
    found: set[str] = set()
    unfiled = main_source() is None

    class Recording(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            kind = obj if isinstance(obj, type) else type(obj)
            for module in (getattr(obj, "__module__", None), kind.__module__):
                if isinstance(module, str):
                    found.add(module)
            if unfiled and isinstance(obj, type | FunctionType) and obj.__module__ == "__main__":
                raise _Unfiled(
                    f"cpu_processes: {obj.__qualname__} is defined in __main__, which a "
                    "worker process cannot import to find it: no file holds it (a notebook, "
                    "the interactive interpreter, python -c), or it is a package's "
                    "__main__.py, whose code runs whole when imported; define it in a module "
                    "(a .py file) and import it from there, or use cpu_threads"
                )
            # A tensor as the batches' are: out of band (shared, not loaded as a copy), of any
            # dtype (torch's own pickles of some cannot be loaded); an array that maps a file
            # as that file's range, mapped again by each worker.
            return tensor_reduction(obj) or maps.reduction(obj) or NotImplemented

    try:
        Recording(file, protocol=5, buffer_callback=buffer_callback).dump(work)
    except _Unfiled:
        raise
    except Exception as error:
        for name, value in (
            ("dataset", work.dataset),
            ("transform", work.transform),
            ("collate_fn", work.collate),
            ("worker_init_fn", work.worker_init),
        ):
            try:
                pickle.dumps(value, protocol=5)
            except Exception as failed:
                raise TypeError(
                    f"cpu_processes: the {name} ({type(value).__name__}) cannot be sent to "
                    f"the worker processes; {_unpicklable(value, name)} cannot be pickled: "
                    f"{failed}"
                ) from failed
        raise TypeError(f"cpu_processes: the loader's work cannot be pickled: {error}") from error
    return found


_OUT_OF_BAND: Final = 1 << 16
"""The smallest array (or other pickle-5 buffer) kept out of the pickle, page-aligned in the
memory after it: it is mapped there, shared, instead of loaded as a copy. Smaller ones are
copied in with the pickle."""


def _out_of_band(buffer: pickle.PickleBuffer) -> bool:
    """Whether ``buffer`` is kept out of the pickle (else pickle copies it in)."""
    try:
        with buffer.raw() as raw:
            return raw.nbytes >= _OUT_OF_BAND
    except BufferError:  # not contiguous: copied in
        return False


class PickledWork:
    """The loader's work, pickled into anonymous memory, and the modules the zygote imports
    for it. The memory is freed with the last of this object and of the workers' maps of it.

    A large array in the work (a dataset that holds its samples in NumPy arrays) is written
    after the pickle, page-aligned, and mapped copy-on-write, so the workers share its pages
    as torch's forked workers do, and a write stays in the worker that made it. One that maps
    a file is sent as the file's range (:mod:`._file_mapped`), the file held open here.
    """

    def __init__(self, work: Work) -> None:
        fd = anonymous(0, "asyncloader-work", sealed=True)
        maps = FileMaps()
        try:
            with open(os.dup(fd), "wb") as file:
                kept: list[pickle.PickleBuffer] = []

                def keep(buffer: pickle.PickleBuffer) -> bool:
                    if not _out_of_band(buffer):
                        return True  # in band
                    kept.append(buffer)
                    return False

                found = _dump(work, file, keep, maps)
                length = file.tell()
                spans = []
                for buffer in kept:
                    with buffer.raw() as raw:
                        offset = -(-file.tell() // mmap.PAGESIZE) * mmap.PAGESIZE
                        file.seek(offset)
                        file.write(raw)
                        spans.append((offset, raw.nbytes, raw.readonly))
                self.layout: Layout = (length, spans, max(file.tell(), 1))
            if _SEALS:
                with contextlib.suppress(OSError):  # not a memfd here: left unsealed
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        except BaseException:
            _close([fd, *maps.files.values()])
            raise
        self._fd = fd
        # With the files that arrays in it map, which the workers open through these.
        self._closed = weakref.finalize(self, _close, [fd, *maps.files.values()])
        self.set_up = work.worker_init is not None
        """Whether each worker runs a ``worker_init_fn`` before its jobs (so no batch is made
        elsewhere)."""
        self.main = "__main__" in found or "__mp_main__" in found
        """Whether it needs the main module (something in it was defined in a script)."""
        # Those an import finds: not one made at run time (Cython's _cython_3_2_8, which
        # holds the type of the functions it compiles), whose import would fail there. Pickle
        # imports what the work needs by name anyway; these are imported first to be shared.
        self.modules = sorted(
            m
            for m in found - {"__main__", "__mp_main__", "builtins"}
            if getattr(sys.modules.get(m), "__spec__", None) is not None
        )

    def descriptor(self) -> int:
        """A descriptor of the memory, for one worker (the caller closes it)."""
        return os.dup(self._fd)


def _close(descriptors: list[int]) -> None:
    for descriptor in descriptors:
        os.close(descriptor)


def pickle_work(work: Work) -> PickledWork:
    """``work`` pickled once, for every worker the loader starts.

    Raises:
        TypeError: Part of it cannot be pickled; the message names the part and attribute.
        RuntimeError: This is a worker process, importing a script whose loader is not
            started under ``if __name__ == "__main__":``.
    """
    if importing_main():
        raise RuntimeError(UNGUARDED)
    return PickledWork(work)


UNGUARDED: Final = (
    "a DataLoader with cpu_processes was built while a worker process imported the main "
    "script: its workers import the script to find what it defines, so the script must "
    "build its loader under `if __name__ == '__main__':`"
)
