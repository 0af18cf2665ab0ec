"""Staging: a dataset prepared once into a fingerprinted snapshot, verified before use.

Staging prepares a dataset's tfds builder (``sources/catalog.py``; a team's data:
``own_snapshot.py``) once into ``<staging_dir>/<name>/<version>/`` and then writes
``staging-manifest.json`` (``layout.STAGING_MANIFEST``) last, listing every file with
its size and SHA-256 (``data/manifest.py``) and a content fingerprint: the SHA-256 of every
file that training reads (the shards, ``features.json``, label files; all but tfds's
``dataset_info.json`` bookkeeping). The staged dataset is keyed by name + version + fingerprint
(``digits:1.0.0@3f2a...``); ``StagedDataset`` (here) is that key and where it lives.

* Staging again finds the manifest and prepares nothing (a cache hit, logged).
  ``cached`` finds that hit without importing tfds or TensorFlow (the Airflow task's
  path: a 0.01 s check instead of a 10 s import); ``stage`` is called when it says no.
* The first staging of ``name:version`` records its fingerprint in
  ``<staging_dir>/<name>/<version>.fingerprint``; a later staging whose content gives
  another fingerprint is refused (the data changed under the same name and version).
* Training verifies every file against the manifest first; a changed byte is a
  ``DatasetError`` that names the file.
* Preparing holds ``<staging_dir>/<name>/<version>.lock`` (``training.locks``); another
  process staging the same dataset waits for it, up to ``STAGING_WAIT_S``.

Reading the staged data back: ``snapshot_reader.py`` (a builder), ``splits.py`` (the
splits training reads); training reads it through ``training/data/input/``.

Why one module of about 360 lines: the cache hit with and without tfds, the manifest,
the fingerprint record and the lock are one transaction with one set of rules; split,
a change to one would have to be mirrored in another file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.config import DatasetConfig
from training.data import manifest as files_manifest
from training.data.sources.catalog import (
    OFFLINE_VERSIONS,
    default_version,
    downloads_fail_fast,
    get_builder,
    record_default_version,
)
from training.errors import DatasetError, shown
from training.layout import STAGING_MANIFEST

log = logging.getLogger(__name__)

# dataset_info.json holds bookkeeping that tfds may rewrite, so it is checksummed but
# not fingerprinted; every other file is content.
_BOOKKEEPING = ("dataset_info.json",)
STAGING_WAIT_S = 1800.0
# 2: the fingerprint covers every content file (1 missed the shards; see stage()).
MANIFEST_FORMAT = 2


@dataclass(frozen=True)
class StagedDataset:
    """Where a prepared dataset lives and what its content is: small enough for XCom."""

    name: str
    version: str
    path: str  # <staging_dir>/<name>/<version>
    staging_dir: str
    fingerprint: str

    @property
    def key(self) -> str:
        return f"{self.name}:{self.version}@{self.fingerprint}"

    def to_dict(self) -> dict[str, str]:
        return {**dataclasses.asdict(self), "key": self.key}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StagedDataset:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> StagedDataset:
        """A staged dataset handed over in a file: ``stage``'s JSON line
        (``{"staged": {...}}``) or the dict in it; ConfigError if it is not one."""
        from training.errors import ConfigError

        try:
            data = json.loads(Path(path).read_text())
            return cls.from_dict(data.get("staged", data))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"--staged {path} is not a staged dataset ({shown(exc)}): "
                              "pass the JSON that `stage` printed") from None


def _fingerprint(entries: list[dict[str, Any]]) -> str:
    return files_manifest.fingerprint(entries, ignore_names=_BOOKKEEPING)


def read_manifest(path: Path) -> dict[str, Any]:
    """A staging manifest, checked: DatasetError (how to fix it) if it is unreadable."""

    def corrupted(reason: str) -> DatasetError:
        return DatasetError(f"staging manifest {path} is corrupted ({reason}); delete "
                            f"{path.parent} and stage again")

    try:
        manifest = json.loads(path.read_text())
        entries = manifest["files"]
        version = str(manifest["version"])
        if not files_manifest.well_formed(entries):
            problem = "a file entry lacks path, size or sha256"
        elif (manifest.get("format") == MANIFEST_FORMAT
                and _fingerprint(entries) != manifest.get("fingerprint")):
            problem = "its fingerprint is not the one of the files it lists"
        else:
            problem = None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise corrupted(shown(exc)) from None
    if problem is not None:
        raise corrupted(problem)
    manifest["version"] = version
    return manifest


def _record_fingerprint(cfg_name: str, version_dir: Path, fingerprint: str) -> None:
    """The first fingerprint of ``name:version`` is recorded; another one is refused."""
    record = version_dir.with_name(version_dir.name + ".fingerprint")
    tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    tmp.write_text(fingerprint + "\n")
    try:
        os.link(tmp, record)  # create-only and whole: the first staging records it
        return
    except FileExistsError:
        recorded = record.read_text().strip()
    finally:
        tmp.unlink()
    if recorded != fingerprint:
        raise DatasetError(
            f"dataset {cfg_name}:{version_dir.name} was staged before with fingerprint "
            f"{recorded} ({record}); its files now give {fingerprint}: the content changed "
            f"under the same name and version. Stage changed data under a new version; if "
            f"the change is intended, delete {version_dir} and {record} first"
        )


def cached(cfg: DatasetConfig, store_options: Any = None) -> StagedDataset | None:
    """The staged dataset when staging it now would be a cache hit, found without
    importing tensorflow-datasets or TensorFlow (an Airflow task calls this first);
    None when ``stage`` has work to do: preparing, upgrading an older manifest,
    computing statistics for another ``validation_fraction``, or resolving a version
    this machine has not resolved before."""
    if cfg.source == "catalog":
        version = cfg.version or default_version(cfg.name, cfg.staging_dir)
        if version is None:
            return None
        version_dir = Path(cfg.staging_dir) / cfg.name / version
    else:
        from training.data.snapshot import own_snapshot
        from training.registry import is_s3, open_store

        store = open_store(cfg.uri, store_options if is_s3(cfg.uri) else None)
        version_dir = Path(own_snapshot.SnapshotBuilder(cfg, store).data_dir)
    manifest_path = version_dir / STAGING_MANIFEST
    if not manifest_path.is_file():
        return None
    manifest = read_manifest(manifest_path)
    if (manifest.get("format") != MANIFEST_FORMAT
            or statistics_key(cfg.validation_fraction) not in manifest.get("statistics", {})):
        return None
    _record_fingerprint(cfg.name, version_dir, manifest["fingerprint"])
    log.info("staging %s: cache hit at %s (fingerprint %s), nothing prepared, "
             "tensorflow-datasets not loaded", cfg.name, version_dir, manifest["fingerprint"])
    return StagedDataset(name=cfg.name, version=manifest["version"],
                         path=os.fspath(version_dir), staging_dir=os.fspath(cfg.staging_dir),
                         fingerprint=manifest["fingerprint"])


def stage(cfg: DatasetConfig, store_options: Any = None) -> StagedDataset:
    """Prepare the dataset once into the staging directory; a cache hit prepares nothing.

    A team's own data (``cfg.source`` images or tfrecord, ``sources/images.py``) is read from
    ``cfg.uri`` with ``store_options`` (S3 credentials; None: boto3's chain)."""
    from training.locks import claim

    if cfg.source == "catalog":
        builder = get_builder(cfg.name, cfg.version, cfg.staging_dir)
    else:
        from training.data.snapshot import own_snapshot
        from training.registry import is_s3, open_store

        store = open_store(cfg.uri, store_options if is_s3(cfg.uri) else None)
        builder = own_snapshot.SnapshotBuilder(cfg, store)
    version_dir = Path(builder.data_dir)
    manifest_path = version_dir / STAGING_MANIFEST
    lock = version_dir.with_name(version_dir.name + ".lock")
    with claim(lock, f"staging directory {version_dir}", wait_s=STAGING_WAIT_S):
        if manifest_path.is_file():
            manifest = read_manifest(manifest_path)
            if manifest.get("format") != MANIFEST_FORMAT:
                manifest = _upgrade(cfg.name, version_dir, manifest)
            log.info("staging %s: cache hit at %s (fingerprint %s), nothing prepared",
                     cfg.name, version_dir, manifest["fingerprint"])
        else:
            manifest = _prepare(cfg, builder, version_dir)
        _record_fingerprint(cfg.name, version_dir, manifest["fingerprint"])
        _record_statistics(cfg, version_dir, manifest)
    if cfg.source == "catalog" and not cfg.version and cfg.name not in OFFLINE_VERSIONS:
        record_default_version(version_dir, manifest["version"])
    return StagedDataset(
        name=cfg.name,
        version=manifest["version"],
        path=os.fspath(version_dir),
        staging_dir=os.fspath(cfg.staging_dir),
        fingerprint=manifest["fingerprint"],
    )


def statistics_key(validation_fraction: float) -> str:
    """Statistics depend on how the splits are read (``splits.split_names``)."""
    return f"validation_fraction={validation_fraction:g}"


def _record_statistics(cfg: DatasetConfig, version_dir: Path,
                       manifest: dict[str, Any]) -> None:
    """The snapshot's statistics (``statistics.py``), computed once, here, where tfds is
    loaded anyway, and kept in the manifest: ``validate_data`` then reads them without
    loading TensorFlow."""
    key = statistics_key(cfg.validation_fraction)
    if key in manifest.get("statistics", {}):
        return
    from training.data.snapshot.snapshot_reader import staged_builder
    from training.data.snapshot.splits import split_names
    from training.data.snapshot.statistics import dataset_statistics

    staged = StagedDataset(name=cfg.name, version=manifest["version"],
                           path=os.fspath(version_dir), staging_dir=os.fspath(cfg.staging_dir),
                           fingerprint=manifest["fingerprint"])
    builder = staged_builder(staged)
    stats = dataset_statistics(builder, split_names(builder, cfg.validation_fraction))
    manifest.setdefault("statistics", {})[key] = stats
    _write_manifest(version_dir, manifest)


def _write_manifest(version_dir: Path, manifest: dict[str, Any]) -> None:
    manifest_path = version_dir / STAGING_MANIFEST
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_bytes(files_manifest.dumps(manifest))
    os.replace(tmp, manifest_path)  # the manifest, written last, marks it complete


def _upgrade(name: str, version_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest of an older format: its files are checked against it, then its
    fingerprint is computed the current way (a new key) and it is rewritten."""
    _check_files(version_dir, manifest, f"dataset {name} at {version_dir}")
    manifest = {**manifest, "format": MANIFEST_FORMAT,
                "fingerprint": _fingerprint(manifest["files"])}
    _write_manifest(version_dir, manifest)
    log.info("staging %s: manifest upgraded to format %d, fingerprint %s", name,
             MANIFEST_FORMAT, manifest["fingerprint"])
    return manifest


def _check_files(root: Path, manifest: dict[str, Any], what: str) -> None:
    bad = files_manifest.first_bad(root, manifest["files"])
    if bad is None:
        return
    if bad.found is None:
        raise DatasetError(f"staged file {bad.path} is missing ({what})")
    raise DatasetError(
        f"staged file {bad.path} is corrupted: its SHA-256 does not match the manifest "
        f"({what}); delete {root} and stage again"
    )


def _prepare(cfg: DatasetConfig, builder: Any, version_dir: Path) -> dict[str, Any]:
    """tfds's download_and_prepare (a team's data: its snapshot's), then the manifest,
    written last."""
    log.info("staging %s: preparing into %s", cfg.name, version_dir)
    extra: dict[str, Any] = {}
    before = _tfds_dirs(cfg)
    try:
        if cfg.source == "catalog":
            import tensorflow_datasets as tfds

            tfds.disable_progress_bar()  # progress bars flood task logs (stderr)
            with downloads_fail_fast(cfg.name, cfg.staging_dir):  # offline: in seconds
                builder.download_and_prepare()
        else:
            extra = builder.prepare(statistics_key(cfg.validation_fraction), STAGING_WAIT_S)
    except DatasetError:
        _remove_partial(cfg, version_dir, before)
        raise
    except Exception as exc:  # no network, a bad checksum, a full disk: tfds raises many
        _remove_partial(cfg, version_dir, before)
        raise DatasetError(f"cannot prepare dataset {cfg.name!r} into {version_dir}: "
                           f"{type(exc).__name__}: {shown(exc)}") from exc
    version_dir.mkdir(parents=True, exist_ok=True)
    # A snapshot's entries come from its partitions' records (hashed when made).
    entries = extra.pop("files", None) or files_manifest.list_files(
        version_dir, skip=lambda path: path.name == STAGING_MANIFEST)
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": cfg.name,
        "version": str(builder.version),
        "fingerprint": _fingerprint(entries),
        "files": entries,
        **extra,
    }
    _write_manifest(version_dir, manifest)
    log.info("staging %s: prepared %d files, fingerprint %s",
             cfg.name, len(entries), manifest["fingerprint"])
    return manifest


def _tfds_dirs(cfg: DatasetConfig) -> set[Path]:
    """The directories under tfds's download folder and the dataset's own folder of
    the staging directory (for a catalog dataset; a team's data: none)."""
    if cfg.source != "catalog":
        return set()
    roots = (Path(cfg.staging_dir) / "downloads", Path(cfg.staging_dir) / cfg.name.split("/")[0])
    return {Path(folder) for root in roots for folder, _, _ in os.walk(root)}


def _remove_partial(cfg: DatasetConfig, version_dir: Path, before: set[Path]) -> None:
    """After a failed preparation, nothing it left: the version's folder, tfds's
    unfinished downloads of this dataset, its default-config record, and the folders
    tfds created (``downloads/``, ``downloads/extracted``, ...) if nothing else is in them."""
    import shutil

    shutil.rmtree(version_dir, ignore_errors=True)
    base = cfg.name.split("/")[0]
    downloads = Path(cfg.staging_dir) / "downloads" / base
    for partial in downloads.rglob("*.tmp.*") if downloads.is_dir() else []:
        with contextlib.suppress(OSError):  # tfds's unfinished downloads
            shutil.rmtree(partial) if partial.is_dir() else partial.unlink()
    config = Path(cfg.staging_dir) / base / ".config"  # tfds's note of a default config
    if cfg.source == "catalog" and config not in before:
        shutil.rmtree(config, ignore_errors=True)
    for folder in sorted(_tfds_dirs(cfg) - before, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # deepest first; only an empty one goes
            folder.rmdir()


def verify(staged: StagedDataset) -> None:
    """Check every staged file against the manifest; DatasetError names the first bad file."""
    root = Path(staged.path)
    manifest_path = root / STAGING_MANIFEST
    if not manifest_path.is_file():
        raise DatasetError(f"dataset {staged.key} is not staged: {manifest_path} is missing")
    manifest = read_manifest(manifest_path)
    if manifest["fingerprint"] != staged.fingerprint:
        raise DatasetError(
            f"dataset {staged.name} at {root} has fingerprint {manifest['fingerprint']}, "
            f"expected {staged.fingerprint}: it was re-staged with different content"
        )
    _check_files(root, manifest, f"dataset {staged.key}")
    log.info("dataset %s verified: %d files match the manifest", staged.key,
             len(manifest["files"]))
