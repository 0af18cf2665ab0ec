"""Local file helpers every area shares: checksums and durable writes."""

from __future__ import annotations

import hashlib
import os

CHUNK = 1024 * 1024  # bytes read or written at a time when streaming a file


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of bytes in memory."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file's or a directory's entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
