"""Object stores: one small interface, an S3 store and a local-directory store.

``open_store(uri, options)`` picks the implementation from the URI:

- ``s3://bucket/prefix`` talks to S3 (or any S3-compatible server) through boto3;
- ``file:///abs/path`` or a plain path is a local directory, the embedded default.

Keys are ``/``-separated and relative to the store's prefix. Every write is atomic
(readers see the old bytes or the new bytes, never a mix) and can be conditional:
``if_none_match=True`` creates only, ``if_match=etag`` replaces only what was read.
A lost conditional write raises :class:`~training.errors.ConflictError`.

Every upload carries the SHA-256 of its bytes (S3: ``ChecksumAlgorithm=SHA256`` for
the transfer, and the hex digest in the object metadata ``sha256``); every S3
download is checked against that digest and a mismatch raises
:class:`~training.errors.IntegrityError` naming the key.

boto3 is imported only when an S3 store is opened, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from training.errors import ConflictError, IntegrityError, StorageError
from training.files import fsync_path, sha256_file

__all__ = [
    "FileStore",
    "ObjectInfo",
    "S3Options",
    "S3Store",
    "Store",
    "check_key",
    "open_store",
]

_CHUNK = 1024 * 1024
# Names the local store uses for its own temporary and lock files; keys may not use them.
_INTERNAL_MARK = ".~"


@dataclass(frozen=True)
class ObjectInfo:
    """What ``head`` knows about one object without reading it."""

    key: str
    size: int
    etag: str
    sha256: str | None
    modified: float | None = None  # when it was written (POSIX seconds), if the store says


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise StorageError."""
    if not isinstance(key, str) or not key:
        raise StorageError(f"object key must be a non-empty string, got {key!r}")
    parts = key.split("/")
    bad = [p for p in parts if p in ("", ".", "..") or p.startswith(_INTERNAL_MARK) or "\\" in p]
    if key.startswith("/") or bad or "\x00" in key:
        raise StorageError(
            f"object key must be '/'-separated relative segments without '', '.', '..', "
            f"'\\' or a leading '{_INTERNAL_MARK}', got {key!r}"
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

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def size(self, key: str) -> int:
        info = self.head(key)
        if info is None:
            raise StorageError(f"no object at {self.uri} key {key!r}")
        return info.size

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


# --------------------------------------------------------------------------- local


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
        return tempfile.mkstemp(prefix=f"{_INTERNAL_MARK}tmp-", dir=directory)

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fsync_path(directory)

    @contextlib.contextmanager
    def _key_lock(self, path: Path):
        lock_path = path.with_name(f"{_INTERNAL_MARK}{path.name}.lock")
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
        return _sha256_hex(data)

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
        return data, _sha256_hex(data)

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        path = self._path(key)
        tmp = None
        try:
            fd, tmp = self._tempfile(path.parent)
            with os.fdopen(fd, "wb") as out, open(local_path, "rb") as src:
                while block := src.read(_CHUNK):
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
            self._commit(tmp, path, key, if_none_match=False, if_match=None)
        except OSError as exc:
            _remove(tmp)  # a full disk leaves no hidden temporary file behind
            raise StorageError(
                f"cannot upload {local_path} to {key!r} in {self.uri}: {exc}"
            ) from exc

    def get_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        src = self._path(key)
        dest = Path(local_path)
        try:
            fd, tmp = self._tempfile(dest.parent)
            try:
                with os.fdopen(fd, "wb") as out, open(src, "rb") as handle:
                    while block := handle.read(_CHUNK):
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

    def list(self, prefix: str = "") -> list[str]:
        # Walk the deepest directory the prefix names, then filter as S3 does.
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if head:
            check_key(head)
        start = self.root.joinpath(*head.split("/")) if head else self.root
        keys = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(_INTERNAL_MARK)]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith(_INTERNAL_MARK):
                    continue
                key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)


# --------------------------------------------------------------------------- S3

_RETRY_MODES = ("standard", "adaptive")
_SSE_MODES = (None, "AES256", "aws:kms")
_ADDRESSING = ("auto", "path", "virtual")
_MIN_PART_MB = 5
_MAX_PART_MB = 5 * 1024


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class S3Options:
    """How to reach S3. Anything left None comes from boto3's standard chain.

    Credentials may be handed in (Airflow connection) or left to the chain
    (environment, profile, instance or pod identity). ``repr`` masks them.
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    retry_mode: str = "standard"
    max_attempts: int = 5
    multipart_threshold_mb: float = 64
    multipart_chunksize_mb: float = 16
    sse: str | None = None
    sse_kms_key_id: str | None = None
    expected_bucket_owner: str | None = None
    addressing_style: str = "auto"
    connect_timeout_s: float = 10
    read_timeout_s: float = 60

    def __post_init__(self) -> None:
        if self.endpoint_url is not None and not re.match(r"^https?://[^/\s]+", self.endpoint_url):
            raise StorageError(
                "endpoint_url must be an http:// or https:// URL or None, "
                f"got {self.endpoint_url!r}"
            )
        if self.retry_mode not in _RETRY_MODES:
            raise StorageError(
                f"retry_mode must be one of {', '.join(_RETRY_MODES)}, got {self.retry_mode!r}"
            )
        if (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
            or not (1 <= self.max_attempts <= 20)
        ):
            raise StorageError(
                f"max_attempts must be an integer between 1 and 20, got {self.max_attempts!r}"
            )
        for name in ("multipart_threshold_mb", "multipart_chunksize_mb"):
            value = getattr(self, name)
            if not _is_number(value) or not (_MIN_PART_MB <= value <= _MAX_PART_MB):
                raise StorageError(
                    f"{name} must be a number of MiB between {_MIN_PART_MB} and {_MAX_PART_MB} "
                    f"(S3's part size limits), got {value!r}"
                )
        if self.sse not in _SSE_MODES:
            raise StorageError(f"sse must be None, 'AES256' or 'aws:kms', got {self.sse!r}")
        if self.sse_kms_key_id is not None and self.sse != "aws:kms":
            raise StorageError(
                f"sse_kms_key_id is only allowed with sse='aws:kms', got sse={self.sse!r}"
            )
        if self.expected_bucket_owner is not None and not re.fullmatch(
            r"\d{12}", str(self.expected_bucket_owner)
        ):
            raise StorageError(
                "expected_bucket_owner must be a 12-digit AWS account id or None, "
                f"got {self.expected_bucket_owner!r}"
            )
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise StorageError(
                "aws_access_key_id and aws_secret_access_key must be given together, got "
                f"aws_access_key_id {'set' if self.aws_access_key_id else 'unset'} and "
                f"aws_secret_access_key {'set' if self.aws_secret_access_key else 'unset'}"
            )
        if self.aws_session_token is not None and self.aws_access_key_id is None:
            raise StorageError(
                "aws_session_token needs aws_access_key_id and aws_secret_access_key, got "
                "a session token alone"
            )
        if self.addressing_style not in _ADDRESSING:
            raise StorageError(
                f"addressing_style must be one of {', '.join(_ADDRESSING)}, "
                f"got {self.addressing_style!r}"
            )
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not _is_number(value) or not (0 < value <= 3600):
                raise StorageError(
                    f"{name} must be a number of seconds in (0, 3600], got {value!r}"
                )

    def __repr__(self) -> str:
        def mask(value: str | None) -> str:
            return "None" if value is None else "'***'"

        fields = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"):
                fields.append(f"{name}={mask(value)}")
            else:
                fields.append(f"{name}={value!r}")
        return f"S3Options({', '.join(fields)})"

    __str__ = __repr__


class S3Store(Store):
    """A bucket and key prefix on S3 or an S3-compatible server."""

    def __init__(self, bucket: str, prefix: str = "", options: S3Options | None = None):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        if not bucket:
            raise StorageError("an s3:// URI needs a bucket name, got an empty one")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.options = options or S3Options()
        opts = self.options
        session = boto3.session.Session(
            aws_access_key_id=opts.aws_access_key_id,
            aws_secret_access_key=opts.aws_secret_access_key,
            aws_session_token=opts.aws_session_token,
            region_name=opts.region_name,
        )
        config = Config(
            retries={"mode": opts.retry_mode, "max_attempts": opts.max_attempts},
            connect_timeout=opts.connect_timeout_s,
            read_timeout=opts.read_timeout_s,
            s3={"addressing_style": opts.addressing_style},
        )
        self._client = session.client("s3", endpoint_url=opts.endpoint_url, config=config)
        mib = 1024 * 1024
        self._transfer = TransferConfig(
            multipart_threshold=int(opts.multipart_threshold_mb * mib),
            multipart_chunksize=int(opts.multipart_chunksize_mb * mib),
        )

    # -- helpers

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _owner(self) -> dict[str, str]:
        owner = self.options.expected_bucket_owner
        return {"ExpectedBucketOwner": owner} if owner else {}

    def _write_args(self, sha256: str) -> dict[str, Any]:
        args: dict[str, Any] = {"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": sha256}}
        if self.options.sse:
            args["ServerSideEncryption"] = self.options.sse
        if self.options.sse_kms_key_id:
            args["SSEKMSKeyId"] = self.options.sse_kms_key_id
        args.update(self._owner())
        return args

    @staticmethod
    def _code(exc: Exception) -> str:
        response = getattr(exc, "response", None) or {}
        return str(response.get("Error", {}).get("Code", ""))

    def _fail(self, action: str, key: str, exc: Exception) -> StorageError:
        code = self._code(exc)
        detail = f"{code}: {exc}" if code else f"{type(exc).__name__}: {exc}"
        return StorageError(f"cannot {action} {key!r} in {self.uri}: {detail}")

    def _calls(self):
        """The exception types a boto3 call may raise that we translate."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        return ClientError, (BotoCoreError, Boto3Error)

    def _verify(self, key: str, expected: str | None, actual: str) -> None:
        if expected is not None and expected != actual:
            raise IntegrityError(
                f"object {key!r} in {self.uri} is corrupt: its recorded SHA-256 is {expected}, "
                f"the bytes read hash to {actual}"
            )

    # -- interface

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if if_none_match and if_match is not None:
            raise StorageError("put_bytes takes if_none_match or if_match, not both")
        client_error, other_errors = self._calls()
        args = self._write_args(_sha256_hex(data))
        if if_none_match:
            args["IfNoneMatch"] = "*"
        if if_match is not None:
            args["IfMatch"] = if_match
        try:
            response = self._client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, **args
            )
        except client_error as exc:
            code = self._code(exc)
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or (
                if_match is not None and code in ("NoSuchKey", "404")
            ):
                condition = "create" if if_none_match else f"replace of ETag {if_match}"
                raise ConflictError(
                    f"conditional {condition} of {key!r} in {self.uri} lost ({code}): "
                    "another writer changed the object first"
                ) from exc
            raise self._fail("write", key, exc) from exc
        except other_errors as exc:
            raise self._fail("write", key, exc) from exc
        return response["ETag"]

    def _get(self, key: str):
        client_error, other_errors = self._calls()
        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key), **self._owner())
        except client_error as exc:
            if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._fail("read", key, exc) from exc
        except other_errors as exc:
            raise self._fail("read", key, exc) from exc

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        _, other_errors = self._calls()
        response = self._get(key)
        if response is None:
            return None
        try:
            data = response["Body"].read()
        except other_errors as exc:
            raise self._fail("read", key, exc) from exc
        self._verify(key, response.get("Metadata", {}).get("sha256"), _sha256_hex(data))
        return data, response["ETag"]

    def get_bytes(self, key: str) -> bytes:
        result = self.get_with_etag(key)
        if result is None:
            raise StorageError(f"no object at {self.uri} key {key!r}")
        return result[0]

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        client_error, other_errors = self._calls()
        try:
            self._client.upload_file(
                os.fspath(local_path),
                self.bucket,
                self._key(key),
                ExtraArgs=self._write_args(sha256_file(local_path)),
                Config=self._transfer,
            )
        except (client_error, *other_errors) as exc:
            raise self._fail("upload", key, exc) from exc
        except OSError as exc:
            raise StorageError(f"cannot upload {local_path} to {key!r}: {exc}") from exc

    def get_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        _, other_errors = self._calls()
        response = self._get(key)
        if response is None:
            raise StorageError(f"no object at {self.uri} key {key!r}")
        dest = Path(local_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{_INTERNAL_MARK}tmp-", dir=dest.parent)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for block in response["Body"].iter_chunks(_CHUNK):
                    digest.update(block)
                    out.write(block)
            self._verify(key, response.get("Metadata", {}).get("sha256"), digest.hexdigest())
            os.replace(tmp, dest)
        except other_errors as exc:
            raise self._fail("download", key, exc) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def head(self, key: str) -> ObjectInfo | None:
        client_error, other_errors = self._calls()
        try:
            response = self._client.head_object(
                Bucket=self.bucket, Key=self._key(key), **self._owner()
            )
        except client_error as exc:
            if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._fail("stat", key, exc) from exc
        except other_errors as exc:
            raise self._fail("stat", key, exc) from exc
        return ObjectInfo(
            key=key,
            size=int(response["ContentLength"]),
            etag=response["ETag"],
            sha256=response.get("Metadata", {}).get("sha256"),
            modified=response["LastModified"].timestamp() if "LastModified" in response else None,
        )

    def list(self, prefix: str = "") -> list[str]:
        client_error, other_errors = self._calls()
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full, **self._owner()):
                keys.extend(item["Key"][strip:] for item in page.get("Contents", []))
        except (client_error, *other_errors) as exc:
            raise self._fail("list", prefix, exc) from exc
        return sorted(keys)


# --------------------------------------------------------------------------- factory


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
