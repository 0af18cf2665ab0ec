"""Dataset catalog, staging and the tf.data input pipeline.

Every dataset is a tensorflow-datasets builder: the built-in offline ``digits``
(``training/digits_builder.py``) or any tfds image-classification dataset (mnist,
fashion_mnist, cifar10, ...). Staging prepares it once into
``<staging_dir>/<name>/<version>/`` and then writes ``staging-manifest.json`` last,
listing every file with its size and SHA-256 and a content fingerprint. The staged
dataset is keyed by name + version + fingerprint (``digits:1.0.0@3f2a...``).

* Staging again finds the manifest and prepares nothing (a cache hit, logged).
* Training verifies every file against the manifest first; a changed byte is a
  ``DatasetError`` that names the file.

Sharding across workers is by data (``AutoShardPolicy.DATA``): every worker reads all
files and keeps every N-th element, which works whatever the number of shards.
"""

from __future__ import annotations

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
from training.errors import ConfigError, DatasetError
from training.storage import sha256_file

log = logging.getLogger(__name__)

MANIFEST = "staging-manifest.json"
# Offline datasets: name -> module whose import registers the builder.
OFFLINE_BUILDERS = {"digits": "training.digits_builder"}
# Files whose bytes define the dataset's content (dataset_info.json also holds
# bookkeeping that tfds may rewrite, so it is checksummed but not fingerprinted).
_CONTENT_SUFFIXES = (".tfrecord", ".array_record", "features.json")


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
    content = [(e["path"], e["sha256"]) for e in entries if e["path"].endswith(_CONTENT_SUFFIXES)]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:16]


def stage(cfg: DatasetConfig) -> StagedDataset:
    """Prepare the dataset once into the staging directory; a cache hit prepares nothing."""
    builder = get_builder(cfg.name, cfg.version, cfg.staging_dir)
    version_dir = Path(builder.data_dir)
    manifest_path = version_dir / MANIFEST
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        log.info("staging %s: cache hit at %s (fingerprint %s), nothing prepared",
                 cfg.name, version_dir, manifest["fingerprint"])
    else:
        log.info("staging %s: preparing into %s", cfg.name, version_dir)
        import tensorflow_datasets as tfds

        tfds.disable_progress_bar()  # progress bars flood task logs (stderr)
        builder.download_and_prepare()
        version_dir.mkdir(parents=True, exist_ok=True)
        entries = _manifest_entries(version_dir)
        manifest = {
            "name": cfg.name,
            "version": str(builder.version),
            "fingerprint": _fingerprint(entries),
            "files": entries,
        }
        tmp = manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, manifest_path)  # the manifest, written last, marks it complete
        log.info("staging %s: prepared %d files, fingerprint %s",
                 cfg.name, len(entries), manifest["fingerprint"])
    return StagedDataset(
        name=cfg.name,
        version=manifest["version"],
        path=os.fspath(version_dir),
        staging_dir=os.fspath(cfg.staging_dir),
        fingerprint=manifest["fingerprint"],
    )


def verify(staged: StagedDataset) -> None:
    """Check every staged file against the manifest; DatasetError names the first bad file."""
    root = Path(staged.path)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise DatasetError(f"dataset {staged.key} is not staged: {manifest_path} is missing")
    manifest = json.loads(manifest_path.read_text())
    if manifest["fingerprint"] != staged.fingerprint:
        raise DatasetError(
            f"dataset {staged.name} at {root} has fingerprint {manifest['fingerprint']}, "
            f"expected {staged.fingerprint}: it was re-staged with different content"
        )
    for entry in manifest["files"]:
        path = root / entry["path"]
        if not path.is_file():
            raise DatasetError(f"staged file {path} is missing (dataset {staged.key})")
        if path.stat().st_size != entry["size"] or sha256_file(path) != entry["sha256"]:
            raise DatasetError(
                f"staged file {path} is corrupted: its SHA-256 does not match the manifest "
                f"(dataset {staged.key}); delete {root} and stage again"
            )
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
