import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from training.config import DatasetConfig
from training.data import staging
from training.errors import ConfigError, DatasetError


def _labels(builder, split):
    ds = builder.as_dataset(split=split, as_supervised=True)
    return np.array([int(y) for _, y in ds])


def test_digits_has_fixed_seeded_disjoint_splits(staged_digits):
    from training.data.digits import split_indices

    builder = staging.load_builder(staged_digits)
    sizes = {name: split.num_examples for name, split in builder.info.splits.items()}
    assert sizes == {"train": 1258, "validation": 180, "test": 359}
    idx = split_indices(1797)
    assert sum(len(v) for v in idx.values()) == 1797
    assert len(set(np.concatenate(list(idx.values())))) == 1797
    for k, v in split_indices(1797).items():  # fixed: the same every time
        assert np.array_equal(v, idx[k])
    assert staging.dataset_info(builder) == {"input_shape": (8, 8, 1), "num_classes": 10}
    assert set(_labels(builder, "test")) == set(range(10))


def test_staging_twice_is_a_cache_hit_that_prepares_nothing(staged_digits, caplog):
    root = Path(staged_digits.path)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    with caplog.at_level(logging.INFO, logger="training.data.staging"):
        again = staging.stage(DatasetConfig(staging_dir=staged_digits.staging_dir))
    assert again == staged_digits
    assert "cache hit" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_manifest_lists_every_file_with_size_and_checksum(staged_digits):
    manifest = json.loads((Path(staged_digits.path) / staging.MANIFEST).read_text())
    listed = {e["path"] for e in manifest["files"]}
    on_disk = {p.name for p in Path(staged_digits.path).iterdir() if p.name != staging.MANIFEST}
    assert listed == on_disk
    assert any(p.endswith(".tfrecord-00000-of-00001") for p in listed)
    assert manifest["fingerprint"] == staged_digits.fingerprint
    assert staged_digits.key == f"digits:1.0.0@{staged_digits.fingerprint}"
    staging.verify(staged_digits)


def test_a_flipped_byte_in_a_shard_is_an_error_naming_the_file(staged_digits, tmp_path):
    import shutil

    copy_root = tmp_path / "digits" / "1.0.0"
    shutil.copytree(staged_digits.path, copy_root)
    staged = staging.StagedDataset(name="digits", version="1.0.0", path=os.fspath(copy_root),
                                    staging_dir=os.fspath(tmp_path),
                                    fingerprint=staged_digits.fingerprint)
    shard = next(copy_root.glob("digits-train.tfrecord-*"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=f"staged file {shard} is corrupted"):
        staging.verify(staged)


def test_unknown_dataset_is_a_config_error_and_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match="dataset.name must be 'digits' or a tensorflow-datasets"
                                          " image-classification dataset .*got 'nope'"):
        staging.stage(DatasetConfig(name="nope", staging_dir=os.fspath(tmp_path / "s")))
    assert list(tmp_path.iterdir()) == []


def test_a_non_image_dataset_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="must be an image-classification dataset"):
        staging.get_builder("imdb_reviews", None, tmp_path)


def test_pipeline_is_seeded_batched_by_global_batch_and_keeps_raw_pixels(staged_digits):
    builder = staging.load_builder(staged_digits)

    def first_labels(seed):
        ds = staging.make_dataset(builder, "train", global_batch_size=50, shuffle=True,
                                   seed=seed)
        images, labels = next(iter(ds))
        return images, labels.numpy()

    images, a = first_labels(1)
    assert images.shape == (50, 8, 8, 1)
    assert images.dtype.name == "uint8"
    assert int(images.numpy().max()) > 200  # 0-255, not pre-scaled
    assert np.array_equal(a, first_labels(1)[1])
    assert not np.array_equal(a, first_labels(2)[1])


def test_validation_is_carved_from_train_when_missing():
    class Info:
        splits = {"train": 1, "test": 1}

    class Builder:
        info = Info()
        name = "x"

    assert staging.split_names(Builder(), 0.1) == {
        "train": "train[:90%]", "validation": "train[90%:]", "test": "test"}


@pytest.mark.parametrize(("name", "shape"), [("mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))])
def test_tfds_datasets_stage_and_load_through_the_same_code(name, shape, tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=20):
        staged = staging.stage(DatasetConfig(name=name, staging_dir=os.fspath(tmp_path)))
        builder = staging.load_builder(staged)
        assert staging.dataset_info(builder) == {"input_shape": shape, "num_classes": 10}
        splits = staging.split_names(builder, 0.1)
        ds = staging.make_dataset(builder, splits["train"], global_batch_size=8, shuffle=True,
                                   seed=0)
        images, labels = next(iter(ds))
    assert images.shape == (8, *shape)
    assert images.dtype.name == "uint8"
    assert staged.name == name and staged.version
