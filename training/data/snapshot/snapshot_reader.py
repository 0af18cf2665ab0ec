"""Reading a staged dataset back under TensorFlow, as a tfds-style builder: a team's
snapshot (its partitions' shards) as one dataset, or tfds's own builder.

``staged_builder`` chooses by what the directory holds: a team's snapshot (its staging
manifest lists shards) reads through ``SnapshotReader``, a tfds-prepared directory
through tfds's builder, and under ``tfds.testing.mock_data`` (nothing written) the
catalog's builder reads. Staging's statistics, the validate step and a TensorFlow
run's input (``input/tf_reader.py``) read through it; a JAX run reads the same files
without TensorFlow (``input/staged_arrays.py``).

A snapshot (``own_snapshot.py``) is not a tensorflow-datasets dataset: each partition
keeps its own shards and its class names, and the snapshot's label indices (its sorted
class names) are applied when it is read. ``SnapshotReader`` offers what the input
pipeline, the statistics, training and evaluation use of a tfds builder, so a snapshot
reads back like ``digits`` or mnist:

* ``name`` and ``info``: ``splits[s].num_examples``, ``features`` (a real
  ``tfds.features.Image`` of the snapshot's shape and ``ClassLabel`` of its names) and
  ``supervised_keys``;
* ``as_dataset(split)``: ``(image, label)`` pairs, uint8 images;
* ``undecoded(split)`` and ``decode``: the same in two steps, so that the input
  pipeline shuffles the small encoded records and decodes after the shuffle.

A split is ``train``, ``validation`` or ``test``, or a whole-percent slice of one as
``splits.split_names`` writes it (``train[:90%]``, ``train[90%:]``). The shards of a
split are read in parallel, one record from each file in turn (the partitions' order),
so that a shuffle buffer holds every day from its first element on, and a seed gives
one order.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.errors import DatasetError
from training.layout import STAGING_MANIFEST

_SLICE = re.compile(r"^(\w+)(?:\[(\d+)?%?:(\d+)?%?\])?$")


def staged_builder(staged: Any) -> Any:
    """The builder reading a staged dataset back from its directory (no preparation, no
    registration: a team's own snapshot reads back like digits or mnist). ``staged`` is
    a ``staging.StagedDataset`` (not imported: staging reads its statistics through
    here)."""
    import tensorflow_datasets as tfds

    if is_snapshot(staged.path):  # a team's data: its partitions' shards
        return SnapshotReader(staged.path)
    if (Path(staged.path) / "dataset_info.json").is_file():
        return tfds.builder_from_directory(staged.path)
    from training.data.sources.catalog import get_builder

    return get_builder(staged.name, staged.version, staged.staging_dir)


def is_snapshot(path: str | Path) -> bool:
    """Whether ``path`` holds a team's snapshot (its staging manifest lists shards)."""
    try:
        return "shards" in json.loads((Path(path) / STAGING_MANIFEST).read_text())
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class SplitSize:
    num_examples: int


class SnapshotInfo:
    """What a tfds ``DatasetInfo`` tells of an image-classification dataset."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        import tensorflow_datasets as tfds

        self.splits = {s: SplitSize(n) for s, n in manifest["examples"].items() if n}
        self.features = {
            "image": tfds.features.Image(shape=tuple(manifest["image_shape"])),
            "label": tfds.features.ClassLabel(names=manifest["labels"]),
        }
        self.supervised_keys = ("image", "label")


class SnapshotReader:
    """A staged snapshot of a team's data, read as one dataset."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest = json.loads((self.path / STAGING_MANIFEST).read_text())
        self.name = manifest["name"]
        self.shards: dict[str, list[str]] = manifest["shards"]
        self.labels: list[str] = manifest["labels"]
        self.shape = tuple(manifest["image_shape"])
        self.info = SnapshotInfo(manifest)

    def _slice(self, split: str) -> tuple[str, int, int | None]:
        """``train[:90%]`` -> ("train", first example, end or None)."""
        match = _SLICE.match(split.replace(" ", ""))
        if not match or match.group(1) not in self.info.splits:
            raise DatasetError(f"snapshot {self.name} at {self.path} has no split "
                               f"{split!r}; it has {sorted(self.info.splits)}")
        name, start, end = match.groups()
        count = self.info.splits[name].num_examples

        def at(percent: str | None, default: int | None) -> int | None:
            return default if percent is None else round(count * int(percent) / 100)

        return name, at(start, 0) or 0, at(end, None)

    def undecoded(self, split: str) -> Any:
        """``(PNG bytes, label index)`` of a split, in order."""
        import tensorflow as tf

        name, start, end = self._slice(split)
        files = [str(self.path / shard) for shard in self.shards[name]]
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(self.labels), tf.range(len(self.labels), dtype=tf.int64)), -1)
        spec = {"image": tf.io.FixedLenFeature([], tf.string),
                "label": tf.io.FixedLenFeature([], tf.string)}

        def parse(record: Any) -> Any:
            example = tf.io.parse_single_example(record, spec)
            return example["image"], table.lookup(example["label"])

        ds = tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=len(files), block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.skip(start) if start else ds
        ds = ds.take(end - start) if end is not None else ds
        return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def decode(self, image: Any, label: Any) -> Any:
        """An undecoded pair -> (uint8 image of the snapshot's shape, label)."""
        import tensorflow as tf

        decoded = tf.io.decode_png(image, channels=self.shape[2])
        return tf.ensure_shape(decoded, self.shape), label

    def as_dataset(self, split: str, as_supervised: bool = True,
                   shuffle_files: bool = False) -> Any:
        """``(image, label)`` pairs of a split, in order (as a tfds builder's
        ``as_supervised`` dataset; the files are never shuffled)."""
        import tensorflow as tf

        if not as_supervised or shuffle_files:
            raise DatasetError("a snapshot is read as_supervised, its files in order")
        return self.undecoded(split).map(self.decode, num_parallel_calls=tf.data.AUTOTUNE,
                                         deterministic=True)
