"""The local object store: a directory whose files are the keys (``file://``, the
embedded default).

- Every write goes to a temporary file in the target directory, is fsynced, then moved
  into place, so readers see the old or the new bytes, never a mix.
- Create-only (``if_none_match``) uses ``os.link(tmp, final)``, which fails if the name
  exists: atomic across threads and processes (the filesystem must support hard links).
- Compare-and-swap (``if_match``) takes an exclusive ``fcntl.flock`` on a per-key lock
  file (``.~<name>.lock`` beside the object), compares the SHA-256 of the current bytes
  with the ETag, and ``os.replace``\\ s under the lock.
- The ETag is the SHA-256 hex of the content. Temporary and lock files start with
  ``.~`` (``store.INTERNAL_MARK``) and never show in ``list``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from training.errors import ConflictError, StorageError
from training.files import CHUNK, fsync_path, sha256_bytes, sha256_file
from training.registry.store import INTERNAL_MARK, ObjectInfo, Store, check_key

__all__ = ["FileStore"]


def _remove(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


class FileStore(Store):
    """A local directory. Keys are files below ``root``.

    Writes go to a temporary file in the target directory, are flushed and fsynced,
    then moved into place: ``os.replace`` for plain writes, ``os.link`` (which fails if
    the name exists) for create-only writes, and ``os.replace`` under an exclusive
    ``fcntl.flock`` on a per-key lock file for If-Match writes. The ETag is the
    SHA-256 of the content, so it changes exactly when the bytes change.
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(os.path.abspath(root))
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _tempfile(self, directory: Path) -> tuple[int, str]:
        directory.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f"{INTERNAL_MARK}tmp-", dir=directory)

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fsync_path(directory)

    @contextlib.contextmanager
    def _key_lock(self, path: Path):
        lock_path = path.with_name(f"{INTERNAL_MARK}{path.name}.lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _commit(
        self, tmp: str, path: Path, key: str, *, if_none_match: bool, if_match: str | None
    ) -> None:
        try:
            if if_none_match:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise ConflictError(
                        f"conditional create of {key!r} in {self.uri} lost: the object exists"
                    ) from None
            elif if_match is not None:
                with self._key_lock(path):
                    current = sha256_file(path) if path.exists() else None
                    if current != if_match:
                        raise ConflictError(
                            f"conditional replace of {key!r} in {self.uri} lost: expected "
                            f"ETag {if_match!r}, found {current!r}"
                        )
                    os.replace(tmp, path)
            else:
                os.replace(tmp, path)
            self._fsync_dir(path.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if if_none_match and if_match is not None:
            raise StorageError("put_bytes takes if_none_match or if_match, not both")
        path = self._path(key)
        tmp = None
        try:
            fd, tmp = self._tempfile(path.parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            self._commit(tmp, path, key, if_none_match=if_none_match, if_match=if_match)
        except OSError as exc:
            _remove(tmp)  # a full disk leaves no hidden temporary file behind
            raise StorageError(f"cannot write {key!r} in {self.uri}: {exc}") from exc
        return sha256_bytes(data)

    def get_bytes(self, key: str) -> bytes:
        result = self.get_with_etag(key)
        if result is None:
            raise StorageError(f"no object at {self.uri} key {key!r}")
        return result[0]

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {key!r} in {self.uri}: {exc}") from exc
        return data, sha256_bytes(data)

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        path = self._path(key)
        tmp = None
        try:
            fd, tmp = self._tempfile(path.parent)
            with os.fdopen(fd, "wb") as out, open(local_path, "rb") as src:
                while block := src.read(CHUNK):
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
            self._commit(tmp, path, key, if_none_match=False, if_match=None)
        except OSError as exc:
            _remove(tmp)  # a full disk leaves no hidden temporary file behind
            raise StorageError(
                f"cannot upload {local_path} to {key!r} in {self.uri}: {exc}"
            ) from exc

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
            parent = path.parent
            while parent != self.root and not any(
                    not p.name.startswith(INTERNAL_MARK) for p in parent.iterdir()):
                shutil.rmtree(parent)  # an empty folder (or one of lock files) goes too
                parent = parent.parent
        except OSError as exc:
            raise StorageError(f"cannot delete {key!r} in {self.uri}: {exc}") from exc

    def get_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        src = self._path(key)
        dest = Path(local_path)
        try:
            fd, tmp = self._tempfile(dest.parent)
            try:
                with os.fdopen(fd, "wb") as out, open(src, "rb") as handle:
                    while block := handle.read(CHUNK):
                        out.write(block)
                os.replace(tmp, dest)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        except FileNotFoundError as exc:
            if not src.exists():
                raise StorageError(f"no object at {self.uri} key {key!r}") from exc
            raise StorageError(f"cannot download {key!r} from {self.uri}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"cannot download {key!r} from {self.uri}: {exc}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            stat = path.stat()
            digest = sha256_file(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot stat {key!r} in {self.uri}: {exc}") from exc
        return ObjectInfo(key=key, size=stat.st_size, etag=digest, sha256=digest,
                          modified=stat.st_mtime)

    def list_folders(self, prefix: str = "") -> list[str]:
        if prefix:
            check_key(prefix.rstrip("/"))
        base = self.root.joinpath(*prefix.rstrip("/").split("/")) if prefix else self.root
        try:
            return sorted(entry.name for entry in os.scandir(base)
                          if entry.is_dir() and not entry.name.startswith(INTERNAL_MARK))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"cannot list {prefix!r} in {self.uri}: {exc}") from exc

    def list(self, prefix: str = "") -> list[str]:
        # Walk the deepest directory the prefix names, then filter as S3 does.
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if head:
            check_key(head)
        start = self.root.joinpath(*head.split("/")) if head else self.root
        keys = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(INTERNAL_MARK)]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith(INTERNAL_MARK):
                    continue
                key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)
