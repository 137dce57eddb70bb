"""The loader's settings, validated once when the loader is built.

Every check names the setting and the value it got, so a typo fails at construction with a
message that points at the argument, never later in the middle of an epoch.
"""

from __future__ import annotations

import inspect
import resource
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from ._cpus import available_cpus
from ._transform import Compose

T = TypeVar("T")


def spare_descriptors() -> int | None:
    """Half the descriptors this process may open (``ulimit -n``), the other half left for
    whatever else it opens: what connections and kept shared memory may take; ``None`` when
    there is no limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return max(soft // 2, 1)


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an ``int`` of at least ``minimum``; raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    return value


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``; raise naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def check_callable(name: str, value: object, arguments: tuple[str, ...]) -> None:
    """Refuse a ``value`` that is neither callable nor ``None``, that cannot be called with
    ``arguments`` (their names, for the message), or that is an async function (or a
    :class:`~asyncloader.Compose` with one): it runs on the CPU threads, which do not await,
    so each call would give a coroutine that nothing awaits. Names ``name``."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {value!r}")
    if isinstance(value, Compose):
        for position, step in enumerate(value.transforms):
            check_callable(f"{name} (its step {position})", step, arguments)
        return
    if value is None:
        return
    if _takes(value, len(arguments)) is False:
        hint = ""
        if len(arguments) == 2 and _takes(value, 1):
            hint = " (a torch-style transform of the item alone? wrap it: lambda i, x: f(x))"
        raise TypeError(
            f"{name} must take ({', '.join(arguments)}), as the loader calls it: {value!r} "
            f"cannot{hint}"
        )
    if _is_async(value):
        raise TypeError(
            f"{name} is an async function ({value!r}): it runs on the CPU threads, which do "
            "not await; make it a plain function (awaiting belongs in an async dataset's "
            "__getitem__)"
        )


def _takes(value: object, count: int) -> bool | None:
    """Whether ``value`` can be called with ``count`` positional arguments; ``None`` when its
    signature cannot be read (some C functions)."""
    try:
        signature = inspect.signature(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True


def _is_async(value: object) -> bool:
    """Whether calling ``value`` gives a coroutine: an async function, or an object whose
    own ``__call__`` is one."""
    if inspect.iscoroutinefunction(value):
        return True
    call = inspect.getattr_static(type(value), "__call__", None)
    return not inspect.isfunction(value) and inspect.iscoroutinefunction(call)


def check_timeout(name: str, value: object) -> float | None:
    """Return ``value`` as seconds (``None`` for no limit); it must be finite and positive."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def _is_zero(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


@dataclass(frozen=True)
class Settings:
    """The numeric settings an epoch runs with (validated by :meth:`build`)."""

    batch_size: int
    drop_last: bool
    num_workers: int
    item_concurrency: int
    prefetch_depth: int
    cpu_threads: int
    timeout: float | None
    pin_memory: bool
    cpu_processes: int = 0
    """Worker processes of the CPU stage (0: threads)."""

    @classmethod
    def build(
        cls,
        *,
        batch_size: object,
        drop_last: object,
        num_workers: object,
        item_concurrency: object,
        prefetch_depth: object,
        cpu_threads: object,
        timeout: object,
        pin_memory: object,
        cpu_processes: object = None,
    ) -> Settings:
        """Validate every setting, naming the first bad one and its value."""
        processes = 0
        if cpu_processes is not None:
            processes = check_int("cpu_processes", cpu_processes, 1)
            if cpu_threads is not None:
                raise ValueError(
                    f"cpu_threads={cpu_threads!r} and cpu_processes={cpu_processes!r} are "
                    "exclusive: the CPU stage runs on threads or in processes"
                )
            cpu_threads = processes  # what the statistics divide the CPU stage's time by
        return cls(
            batch_size=check_int("batch_size", batch_size, 1),
            drop_last=check_bool("drop_last", drop_last),
            num_workers=check_int("num_workers", num_workers, 0),
            item_concurrency=check_int("item_concurrency", item_concurrency, 1),
            prefetch_depth=check_int("prefetch_depth", prefetch_depth, 1),
            cpu_threads=available_cpus()
            if cpu_threads is None
            else check_int("cpu_threads", cpu_threads, 1),
            # 0 is torch's default and means no time-out there too.
            timeout=None if _is_zero(timeout) else check_timeout("timeout", timeout),
            pin_memory=check_bool("pin_memory", pin_memory),
            cpu_processes=processes,
        )

    @property
    def batch_tasks(self) -> int:
        """``num_workers``, at least one, and with ``cpu_processes`` at least two per process
        (each has its next batch while it works on one): batches fetched whole in work at
        once."""
        return max(self.num_workers, 2 * self.cpu_processes, 1)

    @property
    def window(self) -> int:
        """Batches started and not yet taken by the consumer, at most: ``batch_tasks +
        prefetch_depth``."""
        return self.batch_tasks + self.prefetch_depth

    @property
    def requests_in_flight(self) -> int:
        """The most dataset calls in flight at once: ``max(num_workers, 1) * item_concurrency``."""
        return max(self.num_workers, 1) * self.item_concurrency


class ReadOnly(Generic[T]):
    """A documented, read-only attribute of an object, read from one of its parts.

    Args:
        part: The attribute of the owner that holds the value (``"_settings"``), under the
            same name as this attribute.
        doc: The attribute's docstring.
        refresh: A method of the owner to call before the value is read, if any.
    """

    def __init__(self, part: str, doc: str, refresh: str | None = None) -> None:
        self._part, self._name, self._refresh = part, "", refresh
        self.__doc__ = doc

    def __set_name__(self, kind: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, owner: None, kind: type[Any]) -> ReadOnly[T]: ...

    @overload
    def __get__(self, owner: object, kind: type[Any]) -> T: ...

    def __get__(self, owner: object, kind: type[Any]) -> ReadOnly[T] | T:
        """The value (the descriptor itself on the class)."""
        if owner is None:
            return self
        if self._refresh is not None:
            getattr(owner, self._refresh)()
        value: T = getattr(getattr(owner, self._part), self._name)
        return value

    def __set__(self, owner: object, value: object) -> None:
        """Refused: an attribute set here would not be the setting the object runs with."""
        raise AttributeError(
            f"{self._name} is fixed when the {type(owner).__name__} is built; build a new one "
            "to change it"
        )
