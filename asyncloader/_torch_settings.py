"""torch's ``DataLoader`` settings that have no setting of their own here.

A torch user passes them by habit (``persistent_workers=True, prefetch_factor=4``). Those
that mean something here are taken: the loader's threads and worker processes always
persist across epochs, batches always come in order (``in_order=False`` allows another
order, it does not ask for one), and ``prefetch_factor`` (batches loaded ahead by each of
torch's workers) sets the same window of batches. ``worker_init_fn`` runs in each
worker process of ``cpu_processes``, as in each of torch's. The others configure how torch
starts its worker processes: they are refused, naming what to do instead.
"""

from __future__ import annotations

from ._settings import Settings, check_bool, check_callable, check_int

DEFAULT_PREFETCH_DEPTH = 2
"""``prefetch_depth``'s default: given with ``prefetch_factor``, any other is refused."""


def check_torch_settings(
    settings: Settings,
    *,
    prefetch_factor: object,
    persistent_workers: object,
    worker_init_fn: object,
    multiprocessing_context: object,
    pin_memory_device: object,
    in_order: object,
) -> int:
    """Check torch's settings; the ``prefetch_depth`` the loader runs with.

    Raises:
        TypeError: A setting has the wrong type.
        ValueError: A setting configures how torch starts its worker processes,
            ``worker_init_fn`` is given without ``cpu_processes``, or ``prefetch_factor`` is
            out of range or given with ``prefetch_depth``.
    """
    check_bool("persistent_workers", persistent_workers)
    check_bool("in_order", in_order)
    check_callable("worker_init_fn", worker_init_fn, ("worker_id",))
    if worker_init_fn is not None and not settings.cpu_processes:
        raise ValueError(
            "worker_init_fn: it runs in each worker process of cpu_processes, and without "
            "them there is none to run it in (the CPU threads share this process): set "
            "cpu_processes, or do the setup before building the loader"
        )
    if multiprocessing_context is not None:
        raise ValueError(
            "multiprocessing_context: asyncloader starts its worker processes "
            "(cpu_processes) from a fork server of its own, never by forking this process"
        )
    if pin_memory_device != "":
        raise ValueError(
            f"pin_memory_device: {pin_memory_device!r} (deprecated in torch): pin_memory=True "
            "pins for the current accelerator"
        )
    if prefetch_factor is None:
        return settings.prefetch_depth
    factor = check_int("prefetch_factor", prefetch_factor, 0)
    if settings.num_workers == 0:
        raise ValueError(
            f"prefetch_factor: num_workers=0 has no workers to load batches ahead (as in "
            f"torch); prefetch_depth={settings.prefetch_depth} batches start ahead here"
        )
    if settings.prefetch_depth != DEFAULT_PREFETCH_DEPTH:
        raise ValueError(
            f"prefetch_factor={factor} and prefetch_depth={settings.prefetch_depth} are "
            "exclusive: both set how many batches start ahead"
        )
    # torch holds num_workers * prefetch_factor batches: the same window, at least one batch
    # beyond those in work.
    return max(settings.num_workers * factor - settings.batch_tasks, 1)
