"""Which rank this process is, and how many ranks the job has."""

from __future__ import annotations

import os
import sys

from ._settings import check_int


def _from_torch() -> tuple[int, int] | None:
    # Only a torch that the program already imported is asked: torch stays optional.
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return None
    return int(distributed.get_rank()), int(distributed.get_world_size())


def _from_environment() -> tuple[int, int] | None:
    rank, world_size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world_size is None:
        return None
    try:
        return int(rank), int(world_size)
    except ValueError:
        raise ValueError(f"RANK={rank!r} and WORLD_SIZE={world_size!r} must be integers") from None


def resolve_ranks(rank: object, world_size: object) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from ``torch.distributed`` when it is
    initialised, else from the ``RANK`` / ``WORLD_SIZE`` variables torchrun sets, else
    ``(0, 1)``.

    Raises:
        ValueError: ``rank`` is not below ``world_size``, or either is negative; or
            ``world_size`` above 1 is given without a rank, and neither ``torch.distributed``
            nor the environment says one (every process would take rank 0, and read the
            first share only).
    """
    found = _from_torch() or _from_environment()
    default = found or (0, 1)
    resolved_world = default[1] if world_size is None else world_size
    resolved_rank = default[0] if rank is None else rank
    checked_world = check_int("world_size", resolved_world, 1)
    if rank is None and found is None and checked_world > 1:
        raise ValueError(
            f"rank: world_size={checked_world} was given without a rank, and none is known "
            "(torch.distributed is not initialised, and RANK is not set): pass each "
            "process's rank=, or leave both to torchrun's environment"
        )
    checked_rank = check_int("rank", resolved_rank, 0)
    if checked_rank >= checked_world:
        raise ValueError(f"rank must be below world_size={checked_world}, got {checked_rank}")
    return checked_rank, checked_world
