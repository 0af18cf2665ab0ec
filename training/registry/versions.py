"""The model registry on top of a Store: immutable, checksummed versions of named models.

Layout under the store (``training/layout.py`` names every key)::

    models/<name>/versions/<version>/<files...>        the published directory
    models/<name>/versions/<version>/manifest.json     written last: the version exists
    models/<name>/production.json                      the pointer and its history

A version is complete when its ``manifest.json`` exists. The manifest lists every file
with its size and SHA-256 (``training/data/manifest.py``) and is created with
If-None-Match, so a version can be written once: publishing the same bytes again
returns the existing manifest, and publishing different bytes under an existing version
is refused. A publish that stops before the manifest leaves no complete version;
running it again completes it.

``ModelRegistry`` is the public face: publish, show, verify (the first bad file) and
check (every bad file), list and download are here; the production pointer, history,
promote and rollback come from ``pointer.ProductionPointer``, safe Keras loading from
``loading.ModelLoading``.
Names and versions follow ``training.layout.NAME_PATTERN``.

Why one module of about 330 lines: publish writes the manifest that show, verify, check
and download read back, one format and one rule for each file (size and SHA-256);
split, a change to either side would have to be mirrored in the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from training.data import manifest as files_manifest
from training.errors import ConflictError, IntegrityError, RegistryError, StorageError
from training.layout import (
    MODELS_PREFIX,
    VERSION_MANIFEST,
    pointer_key,
    validate_name,
    version_key,
    versions_prefix,
)
from training.registry import open_store
from training.registry.loading import ModelLoading
from training.registry.pointer import ProductionPointer, check_run_id, check_time
from training.registry.s3 import S3Options
from training.registry.store import Store

__all__ = ["ModelRegistry"]

MANIFEST_FORMAT = 1


class ModelRegistry(ProductionPointer, ModelLoading):
    """Versions, manifests, the production pointer and rollback for named models."""

    def __init__(self, store: Store, *, check_model: bool = True, serving_keep: int = 5,
                 followers: Sequence[Any] = ()):
        """``check_model``: promotion loads the version's model with Keras
        (``safe_mode=True``) and runs it on a few inputs of its shape before the pointer
        moves (``check_runs``). Only tests of the pointer itself, on stores of fake
        files, turn it off. ``serving_keep``: the serving layout's folders kept
        (``serving.py``). ``followers``: told of every move of the pointer
        (``pointer_moved(name, pointer, store_uri)``; the MLflow mirror,
        ``training.tracking``)."""
        self.store = store
        self.check_model = check_model
        self.serving_keep = serving_keep
        self.followers = tuple(followers)

    def __repr__(self) -> str:
        return f"ModelRegistry({self.store!r})"

    # -- publish

    @staticmethod
    def _scan(local_dir: Path) -> list[dict[str, Any]]:
        if not local_dir.is_dir():
            raise RegistryError(f"local_dir must be an existing directory, got {str(local_dir)!r}")
        own = local_dir / VERSION_MANIFEST
        if own.is_file():
            raise RegistryError(
                f"local_dir must not hold a top-level {VERSION_MANIFEST} (the registry writes "
                f"it), found {str(own)!r}"
            )
        files = files_manifest.list_files(local_dir)
        if not files:
            raise RegistryError(f"local_dir holds no files to publish: {str(local_dir)!r}")
        return files

    def publish(
        self,
        name: str,
        version: str,
        local_dir: str | os.PathLike[str],
        *,
        run_id: str,
        created: str,
        metrics: dict[str, Any] | None = None,
        source: dict[str, str] | None = None,
        max_bytes: int | None = None,
        only: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Upload ``local_dir`` as version ``version`` of model ``name``; return the manifest.

        ``only``: the relative paths to upload (what the run's steps recorded); others
        under ``local_dir`` are left out. None: every file.

        ``created`` is an ISO 8601 time from the caller (never the clock, so a retry
        writes the same manifest). ``source`` says what produced the version (for the
        Airflow DAG: ``dag_id``, ``run_id`` and the run's ``url``). Idempotent for
        identical files; RegistryError for different files under an existing version.
        """
        validate_name("model name", name)
        validate_name("version", version)
        check_time("created", created)
        check_run_id(run_id)
        if metrics is not None and not isinstance(metrics, dict):
            raise RegistryError(f"metrics must be a dict or None, got {metrics!r}")
        try:
            json.dumps(metrics)
        except (TypeError, ValueError) as exc:
            raise RegistryError(
                f"metrics must be JSON-serializable (plain floats, ints, strings), got "
                f"{metrics!r}: {exc}"
            ) from None
        root = Path(local_dir)
        files = self._scan(root)
        if only is not None:
            files = [f for f in files if f["path"] in set(only)]
        total = sum(f["size"] for f in files)
        if max_bytes is not None and total > max_bytes:
            largest = ", ".join(f"{f['path']} {f['size'] / 2**20:.1f} MiB" for f in
                                sorted(files, key=lambda f: -f["size"])[:3])
            raise RegistryError(
                f"model {name!r} version {version!r} is {total / 2**20:.1f} MiB, over the "
                f"limit of {max_bytes / 2**20:.0f} MiB (max_version_mb); largest files: "
                f"{largest}")

        existing = self._read_manifest(name, version)
        if existing is not None:
            return self._same_or_refuse(name, version, existing, files)

        for entry in files:
            key = version_key(name, version, entry["path"])
            info = self.store.head(key)
            # A retry skips what an interrupted attempt already uploaded intact.
            if info is not None and info.size == entry["size"] and info.sha256 == entry["sha256"]:
                continue
            self.store.put_file(key, root / entry["path"])

        manifest = {
            "format": MANIFEST_FORMAT,
            "name": name,
            "version": version,
            "run_id": run_id,
            "created": created,
            "metrics": metrics or {},
            "source": dict(source or {}),
            "files": files,
        }
        try:
            self.store.put_bytes(version_key(name, version, VERSION_MANIFEST),
                                 files_manifest.dumps(manifest), if_none_match=True)
        except ConflictError:
            # Another publisher completed this version between our check and our write.
            existing = self._read_manifest(name, version)
            if existing is None:
                raise
            return self._same_or_refuse(name, version, existing, files)
        return manifest

    @staticmethod
    def _same_or_refuse(
        name: str, version: str, existing: dict[str, Any], files: list[dict[str, Any]]
    ) -> dict[str, Any]:
        if existing.get("files") == files:
            return existing
        theirs = {f["path"]: f["sha256"] for f in existing.get("files", [])}
        ours = {f["path"]: f["sha256"] for f in files}
        differ = sorted(p for p in theirs.keys() | ours.keys() if theirs.get(p) != ours.get(p))
        raise RegistryError(
            f"version {version!r} of model {name!r} is already published with different "
            f"contents (differing files: {', '.join(differ[:5])}); versions are immutable, "
            "publish under a new version id"
        )

    # -- read and verify

    def _read_manifest(self, name: str, version: str) -> dict[str, Any] | None:
        found = self.store.get_with_etag(version_key(name, version, VERSION_MANIFEST))
        if found is None:
            return None
        try:
            return json.loads(found[0])
        except ValueError as exc:
            raise IntegrityError(
                f"manifest of model {name!r} version {version!r} is not valid JSON: {exc}"
            ) from exc

    def show(self, name: str, version: str) -> dict[str, Any]:
        """The manifest of a complete version; RegistryError if there is none."""
        validate_name("model name", name)
        validate_name("version", version)
        manifest = self._read_manifest(name, version)
        if manifest is None:
            raise RegistryError(
                f"model {name!r} has no complete version {version!r} in {self.store.uri}; "
                f"known versions: {[v['version'] for v in self.list_versions(name)]}"
            )
        return manifest

    def verify(self, name: str, version: str) -> dict[str, Any]:
        """Re-read every file and compare size and SHA-256 with the manifest.

        Returns the manifest; IntegrityError naming the first file that differs.
        """
        manifest = self.show(name, version)
        with contextlib.closing(self.file_problems(name, version, manifest)) as problems:
            for problem in problems:
                raise IntegrityError(problem)
        return manifest

    def check(self, name: str, version: str) -> tuple[dict[str, Any], list[str]]:
        """``verify`` that reads on past a bad file: the manifest and one line per file
        that is damaged, missing or unreadable (none: every file is as published)."""
        manifest = self.show(name, version)
        return manifest, list(self.file_problems(name, version, manifest))

    def file_problems(self, name: str, version: str,
                      manifest: dict[str, Any]) -> Iterator[str]:
        """Each file of ``manifest`` read back from the store and compared (size and
        SHA-256) with its entry, in order; yields what is wrong with each bad one. The
        one check behind ``verify`` (promotion, loading) and ``check`` (``models show``)."""
        with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
            copy = Path(tmp) / "object"
            for entry in manifest["files"]:
                key = version_key(name, version, entry["path"])
                where = f"file {entry['path']!r} of model {name!r} version {version!r}"
                try:
                    self.store.get_file(key, copy)
                except IntegrityError as exc:
                    yield f"{where} is corrupt: {exc}"
                    continue
                except StorageError as exc:
                    yield (f"{where} is missing from the store: {exc}"
                           if not self._exists(key) else f"{where} cannot be read: {exc}")
                    continue
                found = files_manifest.mismatch(copy, entry)
                if found is not None:
                    yield (f"{where} is corrupt: manifest says {entry['size']} bytes, SHA-256 "
                           f"{entry['sha256']}; store holds {found[0]} bytes, SHA-256 "
                           f"{found[1]}")

    def _exists(self, key: str) -> bool:
        """Whether ``key`` is in the store; a store that does not answer: assume so."""
        try:
            return self.store.exists(key)
        except StorageError:
            return True

    def list_models(self) -> list[str]:
        """Names of models with a complete version or a production pointer, sorted."""
        names = set()
        for key in self.store.list(MODELS_PREFIX):
            parts = key.split("/")
            if (len(parts) == 5 and key == version_key(parts[1], parts[3], VERSION_MANIFEST)
                    or len(parts) == 3 and key == pointer_key(parts[1])):
                names.add(parts[1])
        return sorted(names)

    def list_versions(self, name: str) -> list[dict[str, Any]]:
        """Complete versions of ``name``, most recently published first, with their metrics.

        ``published`` is when the version's manifest (written last) was stored, as the
        store reports it (ISO 8601, UTC); ``created`` is the time of the run.
        """
        validate_name("model name", name)
        base = versions_prefix(name)
        found = []  # (when published, when created, version entry)
        for key in self.store.list(base):
            parts = key[len(base) :].split("/")
            if len(parts) == 2 and parts[1] == VERSION_MANIFEST:
                manifest = self._read_manifest(name, parts[0])
                if manifest is not None:
                    info = self.store.head(key)
                    created = datetime.fromisoformat(manifest["created"]).timestamp()
                    stored = info.modified if info and info.modified is not None else created
                    found.append((stored, created, {
                        "version": manifest["version"],
                        "created": manifest["created"],
                        "published": datetime.fromtimestamp(stored, UTC).isoformat(
                            timespec="seconds"),
                        "run_id": manifest["run_id"],
                        "source": manifest.get("source", {}),
                        "metrics": manifest.get("metrics", {}),
                    }))
        found.sort(key=lambda f: (f[0], f[1], f[2]["version"]), reverse=True)
        return [entry for _, _, entry in found]

    def download(self, name: str, version: str, dest_dir: str | os.PathLike[str]) -> str:
        """Copy every file of a complete version into ``dest_dir``, checking each against
        the manifest; returns ``dest_dir``."""
        manifest = self.show(name, version)
        dest = Path(dest_dir)
        for entry in manifest["files"]:
            rel = PurePosixPath(entry["path"])
            if rel.is_absolute() or ".." in rel.parts:
                raise IntegrityError(
                    f"manifest of model {name!r} version {version!r} lists an unsafe path "
                    f"{entry['path']!r}"
                )
            target = dest.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.store.get_file(version_key(name, version, entry["path"]), target)
            found = files_manifest.mismatch(target, entry)
            if found is not None:
                target.unlink()
                raise IntegrityError(
                    f"file {entry['path']!r} of model {name!r} version {version!r} is corrupt: "
                    f"manifest says {entry['size']} bytes, SHA-256 {entry['sha256']}; "
                    f"downloaded {found[0]} bytes, SHA-256 {found[1]}"
                )
        return str(dest)


def open_registry(store_uri: str, options: S3Options | None = None, *, serving_keep: int = 5,
                  followers: Sequence[Any] = ()) -> ModelRegistry:
    """The registry on the store ``store_uri`` names (S3 options from the caller, else
    boto3's chain): the one way the steps, the CLI and the plugin open it."""
    return ModelRegistry(open_store(store_uri, options), serving_keep=serving_keep,
                         followers=followers)
