"""Model registry on top of a Store: immutable versions, a production pointer, history.

Layout under the store::

    models/<name>/versions/<version>/<files...>        the published directory
    models/<name>/versions/<version>/manifest.json     written last: the version exists
    models/<name>/production.json                      the pointer and its history

A version is complete when its ``manifest.json`` exists. The manifest lists every file
with its size and SHA-256 and is created with If-None-Match, so a version can be
written once: publishing the same bytes again returns the existing manifest, and
publishing different bytes under an existing version is refused. A publish that stops
before the manifest leaves no complete version; running it again completes it.

``production.json`` is created with If-None-Match and replaced with If-Match on the
ETag read, so of two concurrent promotions exactly one wins; the loser gets a
ConflictError. The history of promotions lives inside the same object, so pointer
and history change together in one conditional write.

Names and versions follow ``training.layout.NAME_PATTERN``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from training.errors import ConflictError, IntegrityError, RegistryError, StorageError, shown
from training.files import sha256_file
from training.layout import validate_name
from training.registry.store import Store

__all__ = ["MANIFEST", "ModelRegistry"]

MANIFEST = "manifest.json"
FORMAT = 1
def _validate_time(field: str, value: Any) -> str:
    try:
        datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise RegistryError(
            f"{field} must be an ISO 8601 time string from the caller (for example the "
            f"run's logical date, '2025-01-31T00:00:00+00:00'), got {value!r}"
        ) from None
    return value


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _pointer_sum(pointer: dict[str, Any]) -> str:
    """SHA-256 of a pointer's canonical JSON (without its own ``sha256`` field)."""
    return hashlib.sha256(_dump(pointer)).hexdigest()


class ModelRegistry:
    """Versions, manifests, the production pointer and rollback for named models."""

    def __init__(self, store: Store, *, check_model: bool = True):
        """``check_model``: promotion loads the version's model with Keras
        (``safe_mode=True``) and runs it on a few inputs of its shape before the pointer
        moves (``check_runs``). Only tests of the pointer itself, on stores of fake
        files, turn it off."""
        self.store = store
        self.check_model = check_model

    def __repr__(self) -> str:
        return f"ModelRegistry({self.store!r})"

    # -- keys

    @staticmethod
    def _version_prefix(name: str, version: str) -> str:
        return f"models/{name}/versions/{version}/"

    @staticmethod
    def _pointer_key(name: str) -> str:
        return f"models/{name}/production.json"

    # -- publish and read versions

    @staticmethod
    def _scan(local_dir: Path) -> list[dict[str, Any]]:
        if not local_dir.is_dir():
            raise RegistryError(f"local_dir must be an existing directory, got {str(local_dir)!r}")
        files = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(local_dir).as_posix()
            if rel == MANIFEST:
                raise RegistryError(
                    f"local_dir must not hold a top-level {MANIFEST} (the registry writes it), "
                    f"found {str(path)!r}"
                )
            files.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path)})
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
    ) -> dict[str, Any]:
        """Upload ``local_dir`` as version ``version`` of model ``name``; return the manifest.

        ``created`` is an ISO 8601 time from the caller (never the clock, so a retry
        writes the same manifest). ``source`` says what produced the version (for the
        Airflow DAG: ``dag_id``, ``run_id`` and the run's ``url``). Idempotent for
        identical files; RegistryError for different files under an existing version.
        """
        validate_name("model name", name)
        validate_name("version", version)
        _validate_time("created", created)
        if not isinstance(run_id, str) or not run_id:
            raise RegistryError(f"run_id must be a non-empty string, got {run_id!r}")
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
        total = sum(f["size"] for f in files)
        if max_bytes is not None and total > max_bytes:
            largest = ", ".join(f"{f['path']} {f['size'] / 2**20:.1f} MiB" for f in
                                sorted(files, key=lambda f: -f["size"])[:3])
            raise RegistryError(
                f"model {name!r} version {version!r} is {total / 2**20:.1f} MiB, over the "
                f"limit of {max_bytes / 2**20:.0f} MiB (max_version_mb); largest files: "
                f"{largest}")
        prefix = self._version_prefix(name, version)

        existing = self._read_manifest(name, version)
        if existing is not None:
            return self._same_or_refuse(name, version, existing, files)

        for entry in files:
            key = prefix + entry["path"]
            info = self.store.head(key)
            # A retry skips what an interrupted attempt already uploaded intact.
            if info is not None and info.size == entry["size"] and info.sha256 == entry["sha256"]:
                continue
            self.store.put_file(key, root / entry["path"])

        manifest = {
            "format": FORMAT,
            "name": name,
            "version": version,
            "run_id": run_id,
            "created": created,
            "metrics": metrics or {},
            "source": dict(source or {}),
            "files": files,
        }
        try:
            self.store.put_bytes(prefix + MANIFEST, _dump(manifest), if_none_match=True)
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

    def _read_manifest(self, name: str, version: str) -> dict[str, Any] | None:
        found = self.store.get_with_etag(self._version_prefix(name, version) + MANIFEST)
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
        prefix = self._version_prefix(name, version)
        with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
            copy = Path(tmp) / "object"
            for entry in manifest["files"]:
                where = f"file {entry['path']!r} of model {name!r} version {version!r}"
                try:
                    self.store.get_file(prefix + entry["path"], copy)
                except IntegrityError as exc:
                    raise IntegrityError(f"{where} is corrupt: {exc}") from exc
                except StorageError as exc:
                    raise IntegrityError(f"{where} cannot be read: {exc}") from exc
                size, digest = copy.stat().st_size, sha256_file(copy)
                if size != entry["size"] or digest != entry["sha256"]:
                    raise IntegrityError(
                        f"{where} is corrupt: manifest says {entry['size']} bytes, SHA-256 "
                        f"{entry['sha256']}; store holds {size} bytes, SHA-256 {digest}"
                    )
        return manifest

    def list_models(self) -> list[str]:
        """Names of models with a complete version or a production pointer, sorted."""
        names = set()
        for key in self.store.list("models/"):
            parts = key.split("/")
            if (len(parts) == 5 and parts[2] == "versions" and parts[4] == MANIFEST) or (
                    len(parts) == 3 and parts[2] == "production.json"):
                names.add(parts[1])
        return sorted(names)

    def list_versions(self, name: str) -> list[dict[str, Any]]:
        """Complete versions of ``name``, most recently published first, with their metrics.

        ``published`` is when the version's manifest (written last) was stored, as the
        store reports it (ISO 8601, UTC); ``created`` is the time of the run.
        """
        validate_name("model name", name)
        base = f"models/{name}/versions/"
        found = []  # (when published, when created, version entry)
        for key in self.store.list(base):
            parts = key[len(base) :].split("/")
            if len(parts) == 2 and parts[1] == MANIFEST:
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

    def load_model(
        self,
        name: str,
        version: str,
        dest_dir: str | os.PathLike[str],
        *,
        filename: str = "model.keras",
    ):
        """Download and verify a version into ``dest_dir``, then load ``filename`` with
        ``keras.saving.load_model(..., safe_mode=True)``.

        A model that needs unsafe deserialization (a Lambda layer's bytecode, for one)
        is refused with RegistryError.
        """
        dest = Path(self.download(name, version, dest_dir))
        path = dest / filename
        if not path.is_file():
            raise RegistryError(
                f"model {name!r} version {version!r} has no file {filename!r} to load"
            )
        import keras

        try:
            return keras.saving.load_model(path, safe_mode=True)
        except ValueError as exc:
            if "safe_mode" not in str(exc):
                raise RegistryError(f"model {name!r} version {version!r} file {filename!r} "
                                    f"cannot be loaded by Keras: {shown(exc)}") from exc
            raise RegistryError(
                f"model {name!r} version {version!r} file {filename!r} was refused by Keras "
                f"safe_mode (it carries code, such as a Lambda layer, that loading would run): "
                f"{shown(exc)}"
            ) from exc
        except Exception as exc:  # a truncated or foreign file: Keras raises many kinds
            raise RegistryError(f"model {name!r} version {version!r} file {filename!r} "
                                f"cannot be loaded by Keras: {type(exc).__name__}: "
                                f"{shown(exc)}") from exc

    def check_runs(self, name: str, version: str, examples: int = 2) -> dict[str, Any]:
        """Download and verify a version, load its model with ``safe_mode=True`` and run it
        on ``examples`` inputs of its input shape (zeros, the model's dtype); RegistryError
        unless every output is finite with one row per input. Returns what was seen."""
        import numpy as np

        with tempfile.TemporaryDirectory(prefix="check-") as tmp:
            model = self.load_model(name, version, tmp)
            shape = tuple(model.input_shape)[1:]
            if not shape or any(d is None for d in shape):
                raise RegistryError(f"model {name!r} version {version!r} has no fixed input "
                                    f"shape to check it with, got {model.input_shape}")
            dtype = getattr(model.inputs[0], "dtype", "float32")
            inputs = np.zeros((examples, *shape), dtype=str(dtype))
            try:
                outputs = np.asarray(model.predict(inputs, verbose=0))
            except Exception as exc:
                raise RegistryError(f"model {name!r} version {version!r} fails on inputs of "
                                    f"its own shape {shape}: {type(exc).__name__}: "
                                    f"{shown(exc)}") from exc
        finite = bool(np.all(np.isfinite(outputs)))
        if outputs.shape[:1] != (examples,) or not finite:
            raise RegistryError(f"model {name!r} version {version!r} gives unusable outputs "
                                f"(shape {outputs.shape}, all finite: {finite}) for {examples} "
                                f"inputs of shape {shape}")
        return {"input_shape": list(shape), "output_shape": list(outputs.shape)}

    def download(self, name: str, version: str, dest_dir: str | os.PathLike[str]) -> str:
        """Copy every file of a complete version into ``dest_dir``, checking each against
        the manifest; returns ``dest_dir``."""
        manifest = self.show(name, version)
        prefix = self._version_prefix(name, version)
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
            self.store.get_file(prefix + entry["path"], target)
            size, digest = target.stat().st_size, sha256_file(target)
            if size != entry["size"] or digest != entry["sha256"]:
                target.unlink()
                raise IntegrityError(
                    f"file {entry['path']!r} of model {name!r} version {version!r} is corrupt: "
                    f"manifest says {entry['size']} bytes, SHA-256 {entry['sha256']}; "
                    f"downloaded {size} bytes, SHA-256 {digest}"
                )
        return str(dest)

    # -- production pointer

    def _read_pointer(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        found = self.store.get_with_etag(self._pointer_key(name))
        if found is None:
            return None, None
        key = f"{self.store.uri}/{self._pointer_key(name)}"
        try:
            pointer = json.loads(found[0])
        except ValueError as exc:
            raise IntegrityError(
                f"production pointer of model {name!r} ({key}) is not valid JSON: {exc}; "
                "restore it from the store's versioning, or delete it and promote a version "
                "again"
            ) from exc
        if (not isinstance(pointer, dict) or not isinstance(pointer.get("version"), str)
                or not isinstance(pointer.get("history"), list)):
            raise IntegrityError(
                f"production pointer of model {name!r} ({key}) is not a pointer: expected an "
                f"object with 'version' and 'history', got {shown(pointer)}; restore it, or "
                "delete it and promote a version again"
            )
        recorded = pointer.pop("sha256", None)  # pointers written before it carry none
        if recorded is not None and recorded != _pointer_sum(pointer):
            raise IntegrityError(
                f"production pointer of model {name!r} ({key}) does not match its SHA-256 "
                "(changed outside the registry); restore it, or delete it and promote a "
                "version again"
            )
        return pointer, found[1]

    def production(self, name: str) -> str | None:
        """The version in production, or None before the first promotion."""
        validate_name("model name", name)
        pointer, _ = self._read_pointer(name)
        return None if pointer is None else pointer["version"]

    def history(self, name: str) -> list[dict[str, Any]]:
        """Every promotion of ``name``, oldest first."""
        validate_name("model name", name)
        pointer, _ = self._read_pointer(name)
        return [] if pointer is None else list(pointer["history"])

    _UNSET: Any = object()

    def promote(
        self,
        name: str,
        version: str,
        *,
        run_id: str,
        at: str,
        reason: str,
        forced: bool = False,
        expected_current: str | None = _UNSET,
    ) -> dict[str, Any]:
        """Point production at ``version`` after verifying it; return the new pointer.

        ``at`` is an ISO 8601 time from the caller. ``expected_current`` (optional) is
        the version the decision was made against (None: nothing in production); if
        production has moved since, ConflictError. Of two concurrent promotions exactly
        one wins: the other gets ConflictError. Promoting the version already in
        production changes nothing and returns the pointer.
        """
        validate_name("model name", name)
        validate_name("version", version)
        _validate_time("at", at)
        if not isinstance(run_id, str) or not run_id:
            raise RegistryError(f"run_id must be a non-empty string, got {run_id!r}")
        if not isinstance(reason, str) or not reason.strip():
            raise RegistryError(f"reason must be a non-empty string, got {reason!r}")
        pointer, etag = self._read_pointer(name)
        current = None if pointer is None else pointer["version"]
        if current == version:  # checked first: a retried promotion is a no-op
            return pointer
        if expected_current is not self._UNSET and expected_current != current:
            raise ConflictError(
                f"production of model {name!r} moved: the decision to promote {version!r} "
                f"was made against {expected_current!r}, production is now {current!r}; "
                "decide again"
            )
        try:
            if self.check_model:
                self.check_runs(name, version)  # downloads and verifies every file first
            else:
                self.verify(name, version)
        except IntegrityError as exc:
            raise IntegrityError(
                f"refusing to promote model {name!r} version {version!r}: {exc}"
            ) from exc
        except RegistryError as exc:
            raise RegistryError(
                f"refusing to promote model {name!r} version {version!r}: {exc}"
            ) from exc
        record = {
            "from": current,
            "to": version,
            "run_id": run_id,
            "at": at,
            "reason": reason,
            "forced": bool(forced),
        }
        new = {
            "format": FORMAT,
            "name": name,
            "version": version,
            "run_id": run_id,
            "at": at,
            "history": [*(pointer["history"] if pointer else []), record],
        }
        key = self._pointer_key(name)
        body = _dump({**new, "sha256": _pointer_sum(new)})  # verified on every read
        try:
            if etag is None:
                self.store.put_bytes(key, body, if_none_match=True)
            else:
                self.store.put_bytes(key, body, if_match=etag)
        except ConflictError as exc:
            raise ConflictError(
                f"promotion of model {name!r} to {version!r} lost a race: production "
                f"changed after it was read (it was {current!r}); another promotion won. "
                "Re-read production and decide again."
            ) from exc
        return new

    def rollback(
        self, name: str, version: str, *, run_id: str, at: str, note: str | None = None
    ) -> dict[str, Any]:
        """Put an earlier complete version back in production (reason 'rollback').

        Rolling back to the version already in production changes nothing, so a
        retried rollback task gives the same result.
        """
        validate_name("model name", name)
        validate_name("version", version)
        current = self.production(name)
        if current is None:
            raise RegistryError(f"model {name!r} has nothing in production to roll back")
        reason = "rollback" if not note else f"rollback: {note}"
        return self.promote(
            name, version, run_id=run_id, at=at, reason=reason, expected_current=current
        )
