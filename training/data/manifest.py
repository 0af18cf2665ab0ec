"""File manifests: every file under a directory with its size and SHA-256.

One format, two users: a staged dataset's ``staging-manifest.json`` (``snapshot/staging.py``)
and a published model version's ``manifest.json`` (``training/registry/versions.py``)
both list entries ``{"path": "a/b.bin", "size": 123, "sha256": "<hex>"}``, ``path``
relative to the directory and ``/``-separated, sorted by path. This module lists the
files, fingerprints a listing, checks files against entries and writes manifests as
canonical JSON. It raises nothing of its own: the callers know whether a mismatch is a
``DatasetError`` or an ``IntegrityError`` and what to tell the user.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.files import sha256_file

Entry = dict[str, Any]  # {"path": str, "size": int, "sha256": str}
FIELDS = frozenset({"path", "size", "sha256"})


def list_files(root: str | os.PathLike[str], *,
               skip: Callable[[Path], bool] | None = None) -> list[Entry]:
    """An entry for every file below ``root`` (recursively, sorted by path), except those
    ``skip(path)`` is true for."""
    base = Path(root)
    entries = []
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        if skip is not None and skip(path):
            continue
        entries.append({"path": path.relative_to(base).as_posix(),
                        "size": path.stat().st_size, "sha256": sha256_file(path)})
    return entries


def well_formed(entries: Any) -> bool:
    """Whether ``entries`` is a list of objects that each carry path, size and sha256."""
    return isinstance(entries, list) and all(
        isinstance(e, dict) and set(e) >= FIELDS for e in entries)


def fingerprint(entries: Iterable[Entry], *, ignore_names: Iterable[str] = ()) -> str:
    """16 hex digits of SHA-256 over every entry's path and SHA-256 (in order), leaving
    out files whose base name is in ``ignore_names``: what the content is, in one key."""
    ignored = set(ignore_names)
    content = [(e["path"], e["sha256"]) for e in entries
               if Path(e["path"]).name not in ignored]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:16]


def mismatch(path: str | os.PathLike[str], entry: Entry) -> tuple[int, str] | None:
    """None if the file at ``path`` has the entry's size and SHA-256; else what it has
    (size, SHA-256). The file must exist."""
    size, digest = Path(path).stat().st_size, sha256_file(path)
    if size == entry["size"] and digest == entry["sha256"]:
        return None
    return size, digest


@dataclass(frozen=True)
class BadFile:
    """A listed file that is missing (``found`` None) or differs (``found``: its size
    and SHA-256)."""

    entry: Entry
    path: Path
    found: tuple[int, str] | None


def first_bad(root: str | os.PathLike[str], entries: Iterable[Entry]) -> BadFile | None:
    """The first listed file below ``root`` that is missing or differs from its entry."""
    for entry in entries:
        path = Path(root) / entry["path"]
        if not path.is_file():
            return BadFile(entry, path, None)
        found = mismatch(path, entry)
        if found is not None:
            return BadFile(entry, path, found)
    return None


def dumps(obj: Any) -> bytes:
    """Canonical JSON (sorted keys, 2-space indent, final newline): the same object gives
    the same bytes, so a retried write is identical and a checksum over it is stable."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
