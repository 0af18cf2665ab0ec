"""Object stores: one small interface. ``training.registry.open_store(uri, options)``
picks the implementation from the URI:

- ``s3://bucket/prefix`` talks to S3 (or any S3-compatible server) through boto3
  (``S3Store``, ``s3.py``);
- ``file:///abs/path`` or a plain path is a local directory, the embedded default
  (``FileStore``, ``local.py``).

Keys are ``/``-separated and relative to the store's prefix. Every write is atomic
(readers see the old bytes or the new bytes, never a mix) and can be conditional:
``if_none_match=True`` creates only, ``if_match=etag`` replaces only what was read.
A lost conditional write raises :class:`~training.errors.ConflictError`.

Every upload carries the SHA-256 of its bytes (S3: ``ChecksumAlgorithm=SHA256`` for
the transfer, and the hex digest in the object metadata ``sha256``); every S3
download is checked against that digest and a mismatch raises
:class:`~training.errors.IntegrityError` naming the key.

boto3 is imported only when an S3 store is opened, so importing the stores is cheap.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass

from training.errors import StorageError

__all__ = ["INTERNAL_MARK", "ObjectInfo", "Store", "check_key"]

# Names the stores use for their own temporary and lock files; keys may not use them.
INTERNAL_MARK = ".~"


@dataclass(frozen=True)
class ObjectInfo:
    """What ``head`` knows about one object without reading it."""

    key: str
    size: int
    etag: str
    sha256: str | None
    modified: float | None = None  # when it was written (POSIX seconds), if the store says


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise StorageError."""
    if not isinstance(key, str) or not key:
        raise StorageError(f"object key must be a non-empty string, got {key!r}")
    parts = key.split("/")
    bad = [p for p in parts if p in ("", ".", "..") or p.startswith(INTERNAL_MARK) or "\\" in p]
    if key.startswith("/") or bad or "\x00" in key:
        raise StorageError(
            f"object key must be '/'-separated relative segments without '', '.', '..', "
            f"'\\' or a leading '{INTERNAL_MARK}', got {key!r}"
        )
    return key


class Store(ABC):
    """The object store interface the registry and the pipeline use."""

    uri: str

    @abstractmethod
    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        """Write ``data`` at ``key`` atomically and return the new ETag.

        ``if_none_match=True``: only if nothing is at ``key``; ``if_match``: only if the
        object's ETag is still this one. A lost condition raises ConflictError.
        """

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Read the object at ``key``; StorageError if there is none."""

    @abstractmethod
    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        """Read bytes and ETag of ``key`` in one step, or None when there is no object.

        This is the read half of a compare-and-swap: absence is a normal answer.
        """

    @abstractmethod
    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """Upload a local file to ``key`` (unconditional, atomic)."""

    @abstractmethod
    def get_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """Download ``key`` to ``local_path`` (written atomically)."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size, ETag and recorded SHA-256 of ``key``, or None when there is no object."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix`` (a plain string prefix), sorted."""

    def list_folders(self, prefix: str = "") -> list[str]:
        """The names of the "folders" directly under ``prefix`` (which ends with '/' or
        is empty), sorted: ``dt=2026-11-30`` for keys ``dt=2026-11-30/...``. A team's
        dated partitions are found without listing every file of every day."""
        return sorted({key[len(prefix):].split("/", 1)[0] for key in self.list(prefix)
                       if "/" in key[len(prefix):]})

    def delete(self, key: str) -> None:
        """Remove the object at ``key`` (nothing there: nothing to do). Only the serving
        layout's retention deletes; the registry's versions are never deleted."""
        raise StorageError(f"{type(self).__name__} does not delete objects ({key!r})")

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def size(self, key: str) -> int:
        info = self.head(key)
        if info is None:
            raise StorageError(f"no object at {self.uri} key {key!r}")
        return info.size

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
