"""asyncloader: an asyncio-first data loader for machine-learning training.

The layers, from the user inwards (see README.md beside this file for the tree):

- :class:`DataLoader` holds a dataset, a sampler, a transform and a collate function, and runs
  one epoch per iteration: ``for batch in loader`` or ``async for batch in loader``.
- An epoch is one async driver that starts batches at most ``num_workers + prefetch_depth``
  ahead of the consumer, fetches their items with ``num_workers * item_concurrency``
  requests in flight across batch boundaries, transforms and collates on a CPU thread pool
  (or, with ``cpu_processes``, in worker processes), and hands batches over in order.
"""

from ._collate import default_collate as default_collate
from ._loader import DataLoader as DataLoader
from ._processes import WorkerError as WorkerError
from ._sampler import DistributedSampler as DistributedSampler
from ._sampler import RandomSampler as RandomSampler
from ._sampler import Sampler as Sampler
from ._sampler import SequentialSampler as SequentialSampler
from ._skip import SkipBudgetExceeded as SkipBudgetExceeded
from ._stats import LoaderStats as LoaderStats
from ._stats import StageStats as StageStats
from ._stream import SampleError as SampleError
from ._stream import StreamInfo as StreamInfo
from ._stream import stream_info as stream_info
from ._transform import Compose as Compose
from ._transform import Transform as Transform
from .datasets import FileDataset as FileDataset
from .datasets import HttpDataset as HttpDataset
from .datasets import ObjectStoreDataset as ObjectStoreDataset
from .datasets import ParquetShards as ParquetShards
from .datasets import Retry as Retry
from .datasets import TarShards as TarShards
from .datasets import Template as Template
from .transforms import ImageCollator as ImageCollator

__all__ = [
    "Compose",
    "DataLoader",
    "DistributedSampler",
    "FileDataset",
    "HttpDataset",
    "ImageCollator",
    "LoaderStats",
    "ObjectStoreDataset",
    "ParquetShards",
    "RandomSampler",
    "Retry",
    "SampleError",
    "Sampler",
    "SequentialSampler",
    "SkipBudgetExceeded",
    "StageStats",
    "StreamInfo",
    "TarShards",
    "Template",
    "Transform",
    "WorkerError",
    "default_collate",
    "stream_info",
]
__version__ = "0.1.0"
