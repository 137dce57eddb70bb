"""The built-in datasets: items are bytes-like, fetched from HTTP, files or object stores.

They share :class:`Template` locations, :class:`Retry` and ``max_bytes``; each classifies its
own transient failures and maps errors onto ``IndexError``, ``FileNotFoundError``,
``PermissionError``, ``ValueError`` (over ``max_bytes``), ``TimeoutError`` and ``OSError``.
:class:`TarShards` streams WebDataset samples from shards that any of the three locates;
:class:`ParquetShards` streams Parquet rows from files or object stores.
"""

from ._file import FileDataset as FileDataset
from ._http import HttpDataset as HttpDataset
from ._locations import Template as Template
from ._objectstore import ObjectStoreDataset as ObjectStoreDataset
from ._parquet import ParquetShards as ParquetShards
from ._retry import Retry as Retry
from ._shards import TarShards as TarShards

__all__ = [
    "FileDataset",
    "HttpDataset",
    "ObjectStoreDataset",
    "ParquetShards",
    "Retry",
    "TarShards",
    "Template",
]
