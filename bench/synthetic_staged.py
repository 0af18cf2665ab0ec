"""A staged dataset written without TensorFlow, for machines that have none.

The GPU machine this project borrows has JAX and no TensorFlow (no tensorflow-datasets to
stage with), so ``bench/jax_device.py`` makes its data there: a tfds-layout directory
(``dataset_info.json``, ``features.json``, one TFRecord shard per split of
``tf.train.Example`` records: a PNG ``image`` and an int64 ``label``) and the staging
manifest that ``staging.verify`` checks, exactly what ``staging.stage`` leaves for a
tfds dataset, so the training process reads it as it reads ``digits`` or mnist
(``training.data.input.staged_arrays``).

The images are the seed's shapes: each class a fixed blocky pattern, shifted a few
pixels and drowned in noise (as ``bench/training_speed.py``'s), so accuracy means
something.
"""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from training.data import manifest
from training.data.input.records import field, frame, varint
from training.data.snapshot.staging import StagedDataset
from training.layout import STAGING_MANIFEST

VERSION = "1.0.0"


def images(count: int, shape: tuple[int, int, int], classes: int,
           seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` uint8 images of ``shape`` and their labels, learnable but noisy: the
    classes' patterns are the same for every split, the examples ``seed``'s."""
    height, width, channels = shape
    patterns = np.random.default_rng(classes).integers(
        0, 2, (classes, 4, 4, channels)).astype(np.float32) * 160
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, count)
    blocks = np.repeat(np.repeat(patterns, -(-height // 4), 1), -(-width // 4), 2)
    out = np.empty((count, *shape), np.uint8)
    for i, label in enumerate(labels):
        dy, dx = rng.integers(-2, 3, 2)
        base = np.roll(blocks[label, :height, :width], (dy, dx), (0, 1))
        out[i] = np.clip(base + rng.normal(48, 40, shape), 0, 255)
    return out, labels.astype(np.int64)


def _bytes(number: int, payload: bytes) -> bytes:
    return field(number, 2, payload)


def example(png: bytes, label: int) -> bytes:
    """A ``tf.train.Example`` of ``{"image": bytes_list, "label": int64_list}``."""
    image = _bytes(1, _bytes(1, png))  # Feature.bytes_list.value
    number = _bytes(3, _bytes(1, varint(label)))  # Feature.int64_list (packed)
    entries = (_bytes(1, _bytes(1, b"image") + _bytes(2, image))
               + _bytes(1, _bytes(1, b"label") + _bytes(2, number)))
    return _bytes(1, entries)  # Example.features


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(buffer, "PNG")
    return buffer.getvalue()


def write(root: Path, name: str, shape: tuple[int, int, int], classes: int,
          sizes: dict[str, int], seed: int = 0) -> StagedDataset:
    """Stage ``sizes`` examples per split of a synthetic dataset under ``root``."""
    path = root / name / VERSION
    path.mkdir(parents=True, exist_ok=True)
    splits = []
    for index, (split, count) in enumerate(sizes.items()):
        pixels, labels = images(count, shape, classes, seed + index)
        shard = path / f"{name}-{split}.tfrecord-00000-of-00001"
        with shard.open("wb") as file, ThreadPoolExecutor() as pool:  # Pillow encodes
            for png, label in zip(pool.map(_png, pixels), labels, strict=True):  # GIL-free
                file.write(frame(example(png, int(label))))
        splits.append({"filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
                       "name": split, "numBytes": str(shard.stat().st_size),
                       "shardLengths": [str(count)]})
    (path / "dataset_info.json").write_text(json.dumps({
        "fileFormat": "tfrecord", "name": name, "splits": splits, "version": VERSION,
        "supervisedKeys": {"tuple": {"items": [{"featureKey": "image"},
                                               {"featureKey": "label"}]}}}, indent=2))
    (path / "features.json").write_text(json.dumps({"featuresDict": {"features": {
        "image": {"image": {"dtype": "uint8", "shape": {"dimensions": [str(d) for d in shape]}},
                  "pythonClassName": "tensorflow_datasets.core.features.image_feature.Image"},
        "label": {"classLabel": {"numClasses": str(classes)}, "pythonClassName":
                  "tensorflow_datasets.core.features.class_label_feature.ClassLabel"}}}},
        indent=2))
    files = manifest.list_files(path, skip=lambda p: p.name == STAGING_MANIFEST)
    fingerprint = manifest.fingerprint(files, ignore_names=("dataset_info.json",))
    (path / STAGING_MANIFEST).write_text(json.dumps(
        {"files": files, "fingerprint": fingerprint, "format": 2, "name": name,
         "version": VERSION}, indent=1))
    return StagedDataset(name=name, version=VERSION, path=str(path), staging_dir=str(root),
                         fingerprint=fingerprint)

