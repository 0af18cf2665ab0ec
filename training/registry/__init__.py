"""The model registry: object stores, immutable versions, the production pointer, promotion.

- ``store``: the ``Store`` interface; ``local`` (a directory) and ``s3`` implement it;
  ``uri`` parses a store URI; ``open_store`` (here) picks a store by it;
- ``versions``: ``ModelRegistry``, immutable checksummed versions, with ``pointer``
  (production pointer, history, promote, rollback) and ``loading`` (safe Keras loading);
- ``policy``: champion against challenger, with written reasons.

Importing this package imports no boto3: an ``S3Store`` imports it when it is created.
"""

from __future__ import annotations

from training.errors import StorageError
from training.registry.local import FileStore
from training.registry.s3 import S3Options, S3Store
from training.registry.store import Store
from training.registry.uri import StoreURI, is_s3

__all__ = ["StoreURI", "is_s3", "open_store"]


def open_store(uri: str | StoreURI, options: S3Options | None = None) -> Store:
    """Open the store a URI names: ``s3://bucket/prefix``, ``file:///path`` or a path
    (``uri.StoreURI``); ``options`` are an S3 store's endpoint and credentials."""
    where = StoreURI.parse(uri)
    if where.is_s3:
        return S3Store(where.bucket, where.path, options)
    if options is not None:
        raise StorageError(f"S3Options apply to s3:// stores only, got URI {where.text!r}")
    return FileStore(where.path)
