"""The key of reproducible augmentation: ``(loader seed, epoch)``, for the code of an epoch.

The loader sets it while an epoch's items are transformed (on the CPU pool, whose jobs carry
the context, or inline on the direct path). A random transform seeds its generator from this
key, the item's index and its own salt, so an epoch's augmentation is the same whatever the
threads, their timing or the settings, and differs, reproducibly, from epoch to epoch.
"""

from __future__ import annotations

import contextvars

epoch_key: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar(
    "asyncloader_epoch_key", default=(0, 0)
)
"""``(seed, epoch)`` of the epoch being transformed; ``(0, 0)`` outside a loader."""
