"""Where a store is: a parsed store URI, so that "is this S3?" is decided in one place.

A store URI is ``s3://bucket/prefix`` (S3 or an S3-compatible server), ``file:///path``
or a plain local path. ``StoreURI.parse`` reads one and refuses anything else with the
value received and what is allowed; ``is_s3`` answers the one question every caller
asks (which credentials to hand over) for any URI-like string, the model store, a
team's data, the holdout or a backbone's weights alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from training.errors import StorageError

ALLOWED = "s3://bucket/prefix, file:///path or a local path"


def is_s3(uri: str) -> bool:
    """True for an ``s3://`` URI: the one place that decides it."""
    return isinstance(uri, str) and urlparse(uri).scheme == "s3"


@dataclass(frozen=True)
class StoreURI:
    """A store's location: ``s3`` with a bucket and key prefix, or ``file`` with a path."""

    scheme: str  # "s3" or "file"
    bucket: str  # s3 only; "" for a local store
    path: str  # s3: the key prefix (no leading or trailing "/"); file: the local path
    text: str  # as written

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str | StoreURI, field: str = "store URI") -> StoreURI:
        """The URI ``text`` names; StorageError naming ``field``, the value and what is
        allowed when it is empty, not a string, or of another scheme."""
        if isinstance(text, StoreURI):
            return text
        if not isinstance(text, str) or not text:
            raise StorageError(f"{field} must be a non-empty string ({ALLOWED}), got {text!r}")
        parsed = urlparse(text)
        if parsed.scheme == "s3":
            if not parsed.netloc:
                raise StorageError(f"{field}: an s3:// URI needs a bucket name, got {text!r}")
            return cls("s3", parsed.netloc, unquote(parsed.path).strip("/"), text)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise StorageError(f"{field}: file:// URIs must name a local absolute path "
                                   f"(file:///abs/path), got {text!r}")
            return cls("file", "", unquote(parsed.path), text)
        if parsed.scheme and len(parsed.scheme) > 1:  # 'C:' style drive letters aside
            raise StorageError(f"{field} scheme must be s3:// or file:// (or a plain path), "
                               f"got {text!r}")
        return cls("file", "", text, text)
