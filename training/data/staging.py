"""Dataset catalog, staging and the tf.data input pipeline.

Every dataset is a tensorflow-datasets builder: the built-in offline ``digits``
(``training/data/digits.py``) or any tfds image-classification dataset (mnist,
fashion_mnist, cifar10, ...). Staging prepares it once into
``<staging_dir>/<name>/<version>/`` and then writes ``staging-manifest.json`` last,
listing every file with its size and SHA-256 and a content fingerprint: the SHA-256
of every file that training reads (the shards, ``features.json``, label files; all but
tfds's ``dataset_info.json`` bookkeeping). The staged dataset is keyed by name +
version + fingerprint (``digits:1.0.0@3f2a...``).

* Staging again finds the manifest and prepares nothing (a cache hit, logged).
* The first staging of ``name:version`` records its fingerprint in
  ``<staging_dir>/<name>/<version>.fingerprint``; a later staging whose content gives
  another fingerprint is refused (the data changed under the same name and version).
* Training verifies every file against the manifest first; a changed byte is a
  ``DatasetError`` that names the file.
* Preparing holds ``<staging_dir>/<name>/<version>.lock`` (``training.locks``); another
  process staging the same dataset waits for it, up to ``STAGING_WAIT_S``.

Sharding across workers is by data (``AutoShardPolicy.DATA``): every worker reads all
files and keeps every N-th element, which works whatever the number of shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.config import DatasetConfig
from training.errors import ConfigError, DatasetError, shown
from training.files import sha256_file

log = logging.getLogger(__name__)

MANIFEST = "staging-manifest.json"
# Offline datasets: name -> module whose import registers the builder.
OFFLINE_BUILDERS = {"digits": "training.data.digits"}
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


def get_builder(name: str, version: str | None, staging_dir: str | os.PathLike) -> Any:
    """The tfds builder for ``name``; a clear ConfigError when there is none."""
    import tensorflow_datasets as tfds

    if name in OFFLINE_BUILDERS:
        importlib.import_module(OFFLINE_BUILDERS[name])
    spec = f"{name}:{version}" if version else name
    try:
        builder = tfds.builder(spec, data_dir=os.fspath(staging_dir))
    except AssertionError as exc:  # tfds asserts on a version it does not have
        raise ConfigError(f"dataset.version {version!r} is not available for {name!r}: "
                          f"{str(exc).splitlines()[-1][-300:]}") from None
    except (tfds.core.registered.DatasetNotFoundError, ValueError) as exc:
        if version and name in tfds.list_builders(with_community_datasets=False):
            raise ConfigError(
                f"dataset.version {version!r} is not available for {name!r}: "
                f"{str(exc).splitlines()[0]}"
            ) from None
        raise ConfigError(
            f"dataset.name must be 'digits' or a tensorflow-datasets image-classification "
            f"dataset (e.g. mnist, fashion_mnist, cifar10), got {name!r}"
        ) from None
    image_shape, num_classes = _image_classification_info(builder)
    if image_shape is None:
        raise ConfigError(
            f"dataset.name must be an image-classification dataset (an image and a class "
            f"label as supervised keys), got {name!r}"
        )
    return builder


def _image_classification_info(builder: Any) -> tuple[tuple[int, ...] | None, int]:
    import tensorflow_datasets as tfds

    info = builder.info
    keys = info.supervised_keys
    if not keys or len(keys) != 2:
        return None, 0
    image, label = info.features[keys[0]], info.features[keys[1]]
    if not isinstance(image, tfds.features.Image) or not isinstance(
        label, tfds.features.ClassLabel
    ):
        return None, 0
    return tuple(image.shape), label.num_classes


def dataset_info(builder: Any) -> dict[str, Any]:
    """Input shape and class count for the model builder."""
    shape, num_classes = _image_classification_info(builder)
    return {"input_shape": shape, "num_classes": num_classes}


def _manifest_entries(root: Path) -> list[dict[str, Any]]:
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(root).as_posix()
        entries.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path)})
    return entries


def _fingerprint(entries: list[dict[str, Any]]) -> str:
    content = [(e["path"], e["sha256"]) for e in entries
               if Path(e["path"]).name not in _BOOKKEEPING]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:16]


def read_manifest(path: Path) -> dict[str, Any]:
    """A staging manifest, checked: DatasetError (how to fix it) if it is unreadable."""
    try:
        manifest = json.loads(path.read_text())
        entries = manifest["files"]
        if not all(isinstance(e, dict) and {"path", "size", "sha256"} <= set(e) for e in entries):
            raise ValueError("a file entry lacks path, size or sha256")
        if (manifest.get("format") == MANIFEST_FORMAT
                and _fingerprint(entries) != manifest["fingerprint"]):
            raise ValueError("its fingerprint is not the one of the files it lists")
        manifest["version"] = str(manifest["version"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"staging manifest {path} is corrupted ({shown(exc)}); delete "
                           f"{path.parent} and stage again") from None
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


def stage(cfg: DatasetConfig) -> StagedDataset:
    """Prepare the dataset once into the staging directory; a cache hit prepares nothing."""
    from training.locks import claim

    builder = get_builder(cfg.name, cfg.version, cfg.staging_dir)
    version_dir = Path(builder.data_dir)
    manifest_path = version_dir / MANIFEST
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
    return StagedDataset(
        name=cfg.name,
        version=manifest["version"],
        path=os.fspath(version_dir),
        staging_dir=os.fspath(cfg.staging_dir),
        fingerprint=manifest["fingerprint"],
    )


def _write_manifest(version_dir: Path, manifest: dict[str, Any]) -> None:
    manifest_path = version_dir / MANIFEST
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
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
    for entry in manifest["files"]:
        path = root / entry["path"]
        if not path.is_file():
            raise DatasetError(f"staged file {path} is missing ({what})")
        if path.stat().st_size != entry["size"] or sha256_file(path) != entry["sha256"]:
            raise DatasetError(
                f"staged file {path} is corrupted: its SHA-256 does not match the manifest "
                f"({what}); delete {root} and stage again"
            )


def _prepare(cfg: DatasetConfig, builder: Any, version_dir: Path) -> dict[str, Any]:
    """tfds's download_and_prepare, then the manifest, written last."""
    import tensorflow_datasets as tfds

    log.info("staging %s: preparing into %s", cfg.name, version_dir)
    tfds.disable_progress_bar()  # progress bars flood task logs (stderr)
    try:
        builder.download_and_prepare()
    except Exception as exc:  # no network, a bad checksum, a full disk: tfds raises many
        import shutil

        shutil.rmtree(version_dir, ignore_errors=True)  # no half-prepared files stay
        downloads = Path(cfg.staging_dir) / "downloads" / cfg.name.split("/")[0]
        for partial in downloads.rglob("*.tmp.*") if downloads.is_dir() else []:
            with contextlib.suppress(OSError):  # tfds's unfinished downloads
                shutil.rmtree(partial) if partial.is_dir() else partial.unlink()
        raise DatasetError(f"cannot prepare dataset {cfg.name!r} into {version_dir}: "
                           f"{type(exc).__name__}: {shown(exc)}") from exc
    version_dir.mkdir(parents=True, exist_ok=True)
    entries = _manifest_entries(version_dir)
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": cfg.name,
        "version": str(builder.version),
        "fingerprint": _fingerprint(entries),
        "files": entries,
    }
    _write_manifest(version_dir, manifest)
    log.info("staging %s: prepared %d files, fingerprint %s",
             cfg.name, len(entries), manifest["fingerprint"])
    return manifest


def verify(staged: StagedDataset) -> None:
    """Check every staged file against the manifest; DatasetError names the first bad file."""
    root = Path(staged.path)
    manifest_path = root / MANIFEST
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


def split_names(builder: Any, validation_fraction: float) -> dict[str, str]:
    """tfds split expressions for train/validation/test.

    A dataset without a validation split gets one carved from the end of ``train``
    (whole percents, so ``validation_fraction`` is rounded to 1%).
    """
    splits = set(builder.info.splits.keys()) or {"train", "test"}
    if "train" not in splits or "test" not in splits:
        raise DatasetError(
            f"dataset {builder.name} needs 'train' and 'test' splits, has {sorted(splits)}"
        )
    if "validation" in splits:
        return {"train": "train", "validation": "validation", "test": "test"}
    pct = max(1, round(validation_fraction * 100))
    return {"train": f"train[:{100 - pct}%]", "validation": f"train[{100 - pct}%:]",
            "test": "test"}


def make_dataset(
    builder: Any,
    split: str,
    *,
    global_batch_size: int,
    shuffle: bool,
    seed: int,
    shuffle_buffer: int = 10_000,
) -> Any:
    """``as_supervised`` tf.data pipeline: cache, seeded shuffle, batch, prefetch.

    Images stay uint8: the model scales them (a Rescaling layer).
    """
    import numpy as np
    import tensorflow as tf

    ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    ds = ds.with_options(options).cache()
    # Fill the in-memory cache with one pass now. Keras starts each epoch's iterator
    # while the previous one may still be alive (prefetch threads); a second iterator
    # over a half-filled cache reads only what is cached (seen: a validation pass over
    # 89 of 180 examples). A complete cache is the same for every iterator.
    ds.reduce(np.int64(0), lambda count, _: count + 1)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)


def load_builder(staged: StagedDataset) -> Any:
    """The builder reading a staged dataset back (no preparation)."""
    return get_builder(staged.name, staged.version, staged.staging_dir)
