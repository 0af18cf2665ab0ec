"""The pinned holdout: a fixed set of labelled images both models are scored on, every night.

The test split grows with the data (``sources/images.py`` puts each new image in a split
by its hash), so two nights' test accuracies are not measured on the same images. A holdout
named by ``promotion.holdout_uri`` is: a directory or ``s3://bucket/prefix`` holding
``<label>/<image file>`` (no partitions), read through the registry's stores like the
team's data, decoded and resized with ``images.decode`` to the model's input shape.
Its fingerprint (SHA-256 over every key and every file's SHA-256) is recorded beside the
scores, so two reports say whether they were measured on the same holdout.

The decision stays on the current test split; the holdout is reported next to it.
A label directory that is not one of the dataset's classes, an undecodable file or an
empty holdout is a ``DatasetError`` naming it: a pinned set is curated, not filtered.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from training.data.sources.images import decode
from training.errors import DatasetError, StorageError, shown


@dataclass(frozen=True)
class Holdout:
    uri: str
    fingerprint: str
    images: Any  # uint8 array (n, height, width, channels)
    labels: Any  # int64 array (n,): indices into the dataset's class names

    def describe(self) -> dict[str, Any]:
        return {"uri": self.uri, "fingerprint": self.fingerprint,
                "examples": int(len(self.labels))}


def load_holdout(uri: str, store_options: Any, shape: tuple[int, int, int],
                 class_names: list[str]) -> Holdout:
    """Every ``<label>/<file>`` under ``uri``, decoded to ``shape``; labels by their
    index in ``class_names`` (the staged dataset's)."""
    import numpy as np

    from training.registry import is_s3, open_store

    store = open_store(uri, store_options if is_s3(uri) else None)
    try:
        keys = sorted(k for k in store.list("")
                      if not k.rsplit("/", 1)[-1].startswith(("_", ".")))
    except StorageError as exc:
        raise DatasetError(f"cannot list promotion.holdout_uri {uri!r}: {shown(exc)}") from None
    index = {name: i for i, name in enumerate(class_names)}
    digest = hashlib.sha256()
    images, labels = [], []
    for key in keys:
        label, _, name = key.partition("/")
        if not name or "/" in name:
            raise DatasetError(f"promotion.holdout_uri {uri!r}: {key} is not <label>/<file>")
        if label not in index:
            raise DatasetError(
                f"promotion.holdout_uri {uri!r}: label {label!r} ({key}) is not a class of "
                f"the dataset; its classes are {', '.join(class_names)}")
        try:
            data = store.get_bytes(key)
        except StorageError as exc:
            raise DatasetError(f"cannot read {key} of promotion.holdout_uri {uri!r}: "
                               f"{shown(exc)}") from None
        try:
            images.append(decode(data, shape))
        except ValueError as exc:
            raise DatasetError(f"promotion.holdout_uri {uri!r}: {key} is {exc}") from None
        labels.append(index[label])
        digest.update(f"{key}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    if not images:
        raise DatasetError(f"promotion.holdout_uri {uri!r} holds no <label>/<file> image")
    return Holdout(uri=uri, fingerprint=digest.hexdigest()[:16],
                   images=np.stack(images), labels=np.asarray(labels, dtype=np.int64))


def as_dataset(holdout: Holdout, batch_size: int) -> Any:
    """The holdout as a batched ``(image, label)`` tf.data dataset, in key order (a
    list of NumPy batches in a process that runs Keras on JAX: no TensorFlow there)."""
    from training import backend

    if backend.imported() == "jax":
        return [(holdout.images[i:i + batch_size], holdout.labels[i:i + batch_size])
                for i in range(0, len(holdout.labels), batch_size)]
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(
        (holdout.images, holdout.labels)).batch(batch_size)
