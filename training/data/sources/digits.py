"""The built-in offline dataset ``digits`` as a tensorflow-datasets builder.

The 8x8 handwritten digits that ship inside scikit-learn (1,797 images, 10 classes),
scaled from 0-16 to 0-255 uint8 and split once, with a fixed seed, into train (70%),
validation (10%) and test (20%). Because it is a real tfds builder it goes through the
same staging, verification and ``as_supervised`` loading code as mnist or cifar10, and
it needs no network.

Importing this module registers the builder under the name ``digits``.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from training.data.sources.catalog import OFFLINE_VERSIONS

SPLIT_SEED = 20240607  # fixed forever: changing it changes the dataset's content
SPLIT_FRACTIONS = {"train": 0.7, "validation": 0.1, "test": 0.2}


def split_indices(n: int) -> dict[str, np.ndarray]:
    """Deterministic, disjoint index sets for the three splits."""
    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    n_train = round(n * SPLIT_FRACTIONS["train"])
    n_val = round(n * SPLIT_FRACTIONS["validation"])
    return {
        "train": np.sort(order[:n_train]),
        "validation": np.sort(order[n_train : n_train + n_val]),
        "test": np.sort(order[n_train + n_val :]),
    }


class Digits(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's 8x8 digits, offline."""

    VERSION = tfds.core.Version(OFFLINE_VERSIONS["digits"])
    RELEASE_NOTES = {"1.0.0": "Initial release: 70/10/20 split with a fixed seed."}

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description="8x8 images of handwritten digits from scikit-learn (UCI ML).",
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 1)),
                "label": tfds.features.ClassLabel(num_classes=10),
            }),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
        labels = digits.target.astype(np.int64)
        return {
            split: self._generate_examples(images[idx], labels[idx], idx)
            for split, idx in split_indices(len(labels)).items()
        }

    def _generate_examples(self, images, labels, indices):
        for image, label, index in zip(images, labels, indices, strict=True):
            yield int(index), {"image": image, "label": int(label)}
