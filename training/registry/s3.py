"""The S3 object store (``s3://bucket/prefix``): S3 or any S3-compatible server, through
boto3, and ``S3Options``, how to reach it.

Every upload sends ``ChecksumAlgorithm=SHA256`` (S3 checks the transfer) and stores the
SHA-256 hex of the whole object in the user metadata ``sha256``; every download hashes
what it received and compares it with that metadata (``IntegrityError`` naming the
key). Conditional writes use ``PutObject`` with ``IfNoneMatch='*'`` / ``IfMatch=etag``.

boto3 is imported when an ``S3Store`` is created, never when this module is imported.

Over 300 lines on purpose: the options (fifteen fields, each validated with a message
naming it) and the store that uses them are one idea, how this code reaches S3.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.errors import ConflictError, IntegrityError, StorageError
from training.files import CHUNK, sha256_bytes, sha256_file
from training.registry.store import INTERNAL_MARK, ObjectInfo, Store, check_key

__all__ = ["S3Options", "S3Store"]

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
            # staging fetches a partition's objects this many at a time
            # (training/data/snapshot/partition_shards.py FETCH_CONCURRENCY)
            max_pool_connections=32,
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
        args = self._write_args(sha256_bytes(data))
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
        self._verify(key, response.get("Metadata", {}).get("sha256"), sha256_bytes(data))
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

    def delete(self, key: str) -> None:
        client_error, other_errors = self._calls()
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key), **self._owner())
        except (client_error, *other_errors) as exc:
            raise self._fail("delete", key, exc) from exc

    def get_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        _, other_errors = self._calls()
        response = self._get(key)
        if response is None:
            raise StorageError(f"no object at {self.uri} key {key!r}")
        dest = Path(local_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{INTERNAL_MARK}tmp-", dir=dest.parent)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for block in response["Body"].iter_chunks(CHUNK):
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

    def list_folders(self, prefix: str = "") -> list[str]:
        client_error, other_errors = self._calls()
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        names = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/",
                                           **self._owner()):
                names.extend(p["Prefix"][len(full):].rstrip("/")
                             for p in page.get("CommonPrefixes", []))
        except (client_error, *other_errors) as exc:
            raise self._fail("list", prefix, exc) from exc
        return sorted(names)

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
