"""The model registry: object stores, immutable versions, the production pointer, promotion.

- ``store``: the ``Store`` interface; ``local`` (a directory) and ``s3`` implement it;
  ``open_store`` (here) picks one by URI;
- ``versions``: ``ModelRegistry``, immutable checksummed versions, with ``pointer``
  (production pointer, history, promote, rollback) and ``loading`` (safe Keras loading);
- ``policy``: champion against challenger, with written reasons.

Importing this package imports no boto3: an ``S3Store`` imports it when it is created.
"""

from __future__ import annotations

from urllib.parse import unquote, urlparse

from training.errors import StorageError
from training.registry.local import FileStore
from training.registry.s3 import S3Options, S3Store
from training.registry.store import Store

__all__ = ["open_store"]


def open_store(uri: str, options: S3Options | None = None) -> Store:
    """Open the store a URI names: ``s3://bucket/prefix``, ``file:///path`` or a path."""
    if not isinstance(uri, str) or not uri:
        raise StorageError(f"store URI must be a non-empty string, got {uri!r}")
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return S3Store(parsed.netloc, unquote(parsed.path), options)
    if options is not None:
        raise StorageError(f"S3Options apply to s3:// stores only, got URI {uri!r}")
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(
                f"file:// URIs must name a local absolute path (file:///abs/path), got {uri!r}"
            )
        return FileStore(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # 'C:' style drive letters aside
        raise StorageError(
            f"store URI scheme must be s3:// or file:// (or a plain path), got {uri!r}"
        )
    return FileStore(uri)
