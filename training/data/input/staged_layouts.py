"""Where a staged dataset's examples are, read from its own files without tfds.

``staged_arrays.py`` reads staged datasets in a process without TensorFlow; this
module knows the two layouts staging leaves (``snapshot/staging.py``) and nothing else:

* **a tfds-prepared directory** (``digits``, mnist, any tfds dataset):
  ``dataset_info.json`` gives the splits, each shard's length, the file name template,
  the file format (only ``tfrecord`` is readable here: anything else is a
  ``DatasetError``), the supervised keys and whether shuffling is disabled;
  ``features.json`` the image's shape and dtype and the ClassLabel's number of classes
  (names from ``<label>.labels.txt`` when tfds wrote them). Records are
  ``{image key: encoded image, label key: int64}``.
* **a team's snapshot** (``snapshot/own_snapshot.py``; its staging manifest lists
  ``shards``):
  the manifest gives each split's shards in reading order, the sorted class names
  (a label's index is its place among them, as ``SnapshotReader`` applies it), the
  image shape and the examples per split. Records are ``{"image": PNG, "label": the
  class name}``.

``open_layout(path)`` gives a ``Layout``: its ``info`` (``StagedInfo``) and
``examples(slice)``, the ``(encoded image, label index)`` pairs of a split slice in the
tf.data reader's order (``read_order.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from training.data.input import read_order
from training.data.input.records import iter_records, parse_example
from training.errors import DatasetError, shown
from training.layout import STAGING_MANIFEST


@dataclass(frozen=True)
class StagedInfo:
    """What training needs to know of a staged dataset, read without tfds."""

    name: str
    image_shape: tuple[int, int, int]
    num_classes: int
    splits: dict[str, int]  # examples per split
    label_names: tuple[str, ...] | None = None  # None: tfds kept no names

    def dataset_info(self) -> dict[str, Any]:
        """As ``catalog.dataset_info``: the model builder's input shape and classes."""
        return {"input_shape": self.image_shape, "num_classes": self.num_classes}


class Layout:
    """A staged dataset's info and its examples in order."""

    info: StagedInfo

    def examples(self, part: read_order.SplitSlice) -> Iterator[tuple[bytes, int]]:
        raise NotImplementedError


def open_layout(path: Path) -> Layout:
    """The layout of the staged dataset at ``path``; ``DatasetError`` if none is there."""
    manifest = _snapshot_manifest(path / STAGING_MANIFEST)
    if manifest is not None:
        return _SnapshotLayout(path, manifest)
    if (path / "dataset_info.json").is_file():
        return _TfdsLayout(path)
    raise DatasetError(f"staged dataset at {path} has neither a snapshot's "
                       f"{STAGING_MANIFEST} nor tfds's dataset_info.json: stage it first "
                       "(python -m training stage)")


def _snapshot_manifest(path: Path) -> dict[str, Any] | None:
    """A team's snapshot's staging manifest (it lists shards), or None (as
    ``snapshot_reader.is_snapshot``)."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and "shards" in manifest else None


class _SnapshotLayout(Layout):
    """A team's snapshot (``snapshot/own_snapshot.py``): each split's shards of ``{"image": PNG,
    "label": class name}``, read as ``SnapshotReader`` does."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        try:
            self.shards: dict[str, list[str]] = manifest["shards"]
            labels = [str(label) for label in manifest["labels"]]
            shape = tuple(int(d) for d in manifest["image_shape"])
            sizes = {s: int(n) for s, n in manifest["examples"].items() if n}
            name = str(manifest["name"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DatasetError(f"snapshot manifest {path / STAGING_MANIFEST} is unreadable "
                               f"({type(exc).__name__}: {shown(exc)}); it needs name, shards, "
                               "labels, image_shape and examples: stage the snapshot "
                               "again") from None
        if len(shape) != 3:
            raise DatasetError(f"snapshot manifest {path / STAGING_MANIFEST}: image_shape "
                               f"is {list(shape)}, expected [height, width, channels]")
        self.index = {label.encode(): i for i, label in enumerate(labels)}
        self.info = StagedInfo(name, shape, len(labels), sizes, tuple(labels))

    def examples(self, part: read_order.SplitSlice) -> Iterator[tuple[bytes, int]]:
        files = [self.path / shard for shard in self.shards.get(part.split, [])]
        stream = read_order.interleave((self._read(f) for f in files),
                                       cycle_length=max(1, len(files)), block_length=1)
        return islice(stream, part.start, part.end)

    def _read(self, path: Path) -> Iterator[tuple[bytes, int]]:
        for number, record in enumerate(iter_records(path)):
            features = parse_example(record)
            image, label = features.get("image"), features.get("label")
            if not _one_bytes(image) or not _one_bytes(label):
                raise DatasetError(f"snapshot shard {path}, record {number}: needs one "
                                   "bytes 'image' and one bytes 'label', has "
                                   f"{_kinds(features)}")
            index = self.index.get(label[0])
            if index is None:
                raise DatasetError(f"snapshot shard {path}, record {number}: label "
                                   f"{shown(label[0])} is not one of the snapshot's labels "
                                   f"{sorted(self.index)}; stage the snapshot again")
            yield image[0], index


class _TfdsLayout(Layout):
    """A tfds-prepared directory: ``dataset_info.json`` (splits, shard lengths, file
    template, file format, supervised keys) and ``features.json`` (the image's shape,
    the ClassLabel's classes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        info_file = path / "dataset_info.json"
        info = _json(info_file)
        name = str(info.get("name", path.parent.name))
        file_format = info.get("fileFormat") or "tfrecord"  # tfds before 4.1 wrote none
        if file_format != "tfrecord":
            raise DatasetError(f"{info_file}: fileFormat is {file_format!r}; only "
                               "'tfrecord' shards can be read without TensorFlow")
        self.image_key, self.label_key = _supervised_keys(info, info_file)
        features_file = path / "features.json"
        features = (_json(features_file) if features_file.is_file()
                    else info.get("features", {}))
        where = features_file if features_file.is_file() else info_file
        specs = features.get("featuresDict", {}).get("features", {})
        shape, num_classes = _image_shape(specs, self.image_key, where), _classes(
            specs, self.label_key, where)
        self.files: dict[str, list[Path]] = {}
        self.lengths: dict[str, list[int]] = {}
        for split in info.get("splits", []):
            lengths = [int(n) for n in split.get("shardLengths", [])]
            template = split.get("filepathTemplate") or (
                "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}")
            self.lengths[split["name"]] = lengths
            self.files[split["name"]] = [path / _shard_name(
                template, name, split["name"], file_format, i, len(lengths))
                for i in range(len(lengths))]
        self.cycle_length = (read_order.TFDS_ORDERED_CYCLE_LENGTH
                             if info.get("disableShuffling") else read_order.TFDS_CYCLE_LENGTH)
        names_file = path / f"{self.label_key}.labels.txt"
        names = (tuple(names_file.read_text().splitlines()) if names_file.is_file()
                 else None)
        self.info = StagedInfo(name, shape, num_classes,
                               {s: sum(n) for s, n in self.lengths.items()}, names)

    def examples(self, part: read_order.SplitSlice) -> Iterator[tuple[bytes, int]]:
        files = self.files[part.split]
        reads = read_order.tfds_shard_reads(self.lengths[part.split], part.start, part.end)
        return read_order.interleave(
            (islice(self._read(files[i]), skip, skip + take) for i, skip, take in reads),
            cycle_length=self.cycle_length, block_length=read_order.TFDS_BLOCK_LENGTH)

    def _read(self, path: Path) -> Iterator[tuple[bytes, int]]:
        for number, record in enumerate(iter_records(path)):
            features = parse_example(record)
            image, label = features.get(self.image_key), features.get(self.label_key)
            if not _one_bytes(image) or not (isinstance(label, list) and len(label) == 1
                                            and isinstance(label[0], int)):
                raise DatasetError(f"tfds shard {path}, record {number}: needs one bytes "
                                   f"{self.image_key!r} and one int64 {self.label_key!r}, "
                                   f"has {_kinds(features)}")
            yield image[0], label[0]


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path} cannot be read ({shown(exc)}); stage the dataset "
                           "again") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{path} holds {type(data).__name__}, expected a JSON object")
    return data


def _supervised_keys(info: dict[str, Any], where: Path) -> tuple[str, str]:
    """``(image key, label key)``: tfds's ``{"tuple": {"items": [{"featureKey"}...]}}``
    or the older ``{"input", "output"}``."""
    keys = info.get("supervisedKeys") or {}
    items = keys.get("tuple", {}).get("items", [])
    found = ([item.get("featureKey") for item in items] if items
             else [keys.get("input"), keys.get("output")])
    if len(found) != 2 or not all(isinstance(k, str) and k for k in found):
        raise DatasetError(f"{where}: supervisedKeys is {shown(keys)}; an image "
                           "classification dataset needs two: an image and a class label")
    return found[0], found[1]


def _image_shape(specs: dict[str, Any], key: str, where: Path) -> tuple[int, int, int]:
    image = specs.get(key, {}).get("image")
    if not isinstance(image, dict):
        raise DatasetError(f"{where}: feature {key!r} is {shown(specs.get(key))}, "
                           "expected a tfds Image")
    shape = [int(d) for d in image.get("shape", {}).get("dimensions", [])]
    dtype = image.get("dtype", "uint8")
    if len(shape) != 3 or any(d < 1 for d in shape) or dtype != "uint8":
        raise DatasetError(f"{where}: image {key!r} has shape {shape} and dtype {dtype}; "
                           "readable without TensorFlow: uint8 images of one fixed shape "
                           "[height, width, channels]")
    return shape[0], shape[1], shape[2]


def _classes(specs: dict[str, Any], key: str, where: Path) -> int:
    label = specs.get(key, {}).get("classLabel")
    if not isinstance(label, dict) or int(label.get("numClasses", 0)) < 1:
        raise DatasetError(f"{where}: feature {key!r} is {shown(specs.get(key))}, "
                           "expected a tfds ClassLabel with numClasses")
    return int(label["numClasses"])


def _shard_name(template: str, dataset: str, split: str, file_format: str, index: int,
                count: int) -> str:
    """A shard's file name from tfds's ``filepathTemplate`` (``naming.py``)."""
    digits = max(len(str(count)), 5)
    shard, total = f"{index:0{digits}d}", f"{count:0{digits}d}"
    try:
        return template.format(DATASET=dataset, SPLIT=split, FILEFORMAT=file_format,
                               SHARD_INDEX=shard, NUM_SHARDS=total,
                               SHARD_X_OF_Y=f"{shard}-of-{total}")
    except (KeyError, IndexError, ValueError) as exc:
        raise DatasetError(f"filepathTemplate {template!r} cannot be filled ({shown(exc)}); "
                           "it may use DATASET, SPLIT, FILEFORMAT, SHARD_INDEX, "
                           "NUM_SHARDS, SHARD_X_OF_Y") from None


def _one_bytes(values: Any) -> bool:
    return isinstance(values, list) and len(values) == 1 and isinstance(values[0], bytes)


def _kinds(features: dict[str, Any]) -> str:
    return ", ".join(f"{k!r}: {len(v)} {type(v[0]).__name__ if v else 'empty'}"
                     for k, v in sorted(features.items())) or "no features"
