"""Local file helpers every area shares: checksums and durable writes."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

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


def replace_file(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``<path>.tmp``, flush it to disk, rename it over ``path`` and
    flush the rename: a crash leaves the old file or the new one, never a part, and a
    reader that still holds the old file (a memory map) keeps it whole."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        for chunk in chunks:
            handle.write(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_path(path.parent)


# --- a directory replaced whole ---------------------------------------------------------
# The next version of a directory is written completely into ``<dir>.new`` (its last
# file written last), then ``swap_dir`` puts it in place with two renames
# (``dir -> dir.old``, ``dir.new -> dir``); ``finish_dir_swap`` repairs a swap that a crash
# cut short. Readers see either the old version or the new one, never a mix.


def pending_dir(target: str | os.PathLike[str]) -> Path:
    """Where the next version of the directory ``target`` is written: ``<target>.new``."""
    target = Path(target)
    return target.with_name(target.name + ".new")


def _previous_dir(target: Path) -> Path:
    return target.with_name(target.name + ".old")


def swap_dir(target: str | os.PathLike[str]) -> None:
    """Flush ``pending_dir(target)`` to disk, then swap it in as ``target``."""
    target = Path(target)
    new, old = pending_dir(target), _previous_dir(target)
    for child in new.iterdir():
        fsync_path(child)
    fsync_path(new)
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    new.rename(target)
    fsync_path(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def finish_dir_swap(target: str | os.PathLike[str], *, last_file: str) -> None:
    """Complete a ``swap_dir`` that a crash interrupted, and drop what it left: with no
    ``target``, a complete ``<target>.new`` (it holds ``last_file``, written last) is
    moved in, else ``<target>.old`` is put back; a half-written ``.new`` is removed."""
    target = Path(target)
    new, old = pending_dir(target), _previous_dir(target)
    if not target.exists():
        if (new / last_file).exists():
            new.rename(target)
        elif old.exists():
            old.rename(target)
    shutil.rmtree(new, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def settled_dir(target: str | os.PathLike[str], *, last_file: str) -> Path | None:
    """The directory ``finish_dir_swap(target, last_file=...)`` would leave at ``target``
    (``target`` itself, a complete ``<target>.new`` or ``<target>.old``), or None: what
    a reader that must not move anything (another process's directory) looks at."""
    target = Path(target)
    new, old = pending_dir(target), _previous_dir(target)
    if target.exists():
        return target
    if (new / last_file).exists():
        return new
    return old if old.exists() else None
