import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from training.config import DatasetConfig
from training.data import manifest
from training.data.input.choose import load_builder, make_dataset
from training.data.snapshot import staging
from training.data.snapshot.splits import split_names
from training.data.sources.catalog import dataset_info, get_builder
from training.errors import ConfigError, DatasetError
from training.layout import STAGING_MANIFEST


def _labels(builder, split):
    ds = builder.as_dataset(split=split, as_supervised=True)
    return np.array([int(y) for _, y in ds])


def test_digits_has_fixed_seeded_disjoint_splits(staged_digits):
    from training.data.sources.digits import split_indices

    builder = load_builder(staged_digits)
    sizes = {name: split.num_examples for name, split in builder.info.splits.items()}
    assert sizes == {"train": 1258, "validation": 180, "test": 359}
    idx = split_indices(1797)
    assert sum(len(v) for v in idx.values()) == 1797
    assert len(set(np.concatenate(list(idx.values())))) == 1797
    for k, v in split_indices(1797).items():  # fixed: the same every time
        assert np.array_equal(v, idx[k])
    assert dataset_info(builder) == {"input_shape": (8, 8, 1), "num_classes": 10}
    assert set(_labels(builder, "test")) == set(range(10))


def test_staging_twice_is_a_cache_hit_that_prepares_nothing(staged_digits, caplog):
    root = Path(staged_digits.path)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    with caplog.at_level(logging.INFO, logger="training.data.snapshot.staging"):
        again = staging.stage(DatasetConfig(staging_dir=staged_digits.staging_dir))
    assert again == staged_digits
    assert "cache hit" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_manifest_lists_every_file_with_size_and_checksum(staged_digits):
    manifest = json.loads((Path(staged_digits.path) / STAGING_MANIFEST).read_text())
    listed = {e["path"] for e in manifest["files"]}
    on_disk = {p.name for p in Path(staged_digits.path).iterdir() if p.name != STAGING_MANIFEST}
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
        get_builder("imdb_reviews", None, tmp_path)


def test_pipeline_is_seeded_batched_by_global_batch_and_keeps_raw_pixels(staged_digits):
    builder = load_builder(staged_digits)

    def first_labels(seed):
        ds = make_dataset(builder, "train", global_batch_size=50, shuffle=True,
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

    assert split_names(Builder(), 0.1) == {
        "train": "train[:90%]", "validation": "train[90%:]", "test": "test"}


@pytest.mark.parametrize(("name", "shape"), [("mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))])
def test_tfds_datasets_stage_and_load_through_the_same_code(name, shape, tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=20):
        staged = staging.stage(DatasetConfig(name=name, staging_dir=os.fspath(tmp_path)))
        builder = load_builder(staged)
        assert dataset_info(builder) == {"input_shape": shape, "num_classes": 10}
        splits = split_names(builder, 0.1)
        ds = make_dataset(builder, splits["train"], global_batch_size=8, shuffle=True,
                          seed=0)
        images, labels = next(iter(ds))
    assert images.shape == (8, *shape)
    assert images.dtype.name == "uint8"
    assert staged.name == name and staged.version


def _write_manifest(tmp_path, manifest) -> Path:
    path = tmp_path / STAGING_MANIFEST
    path.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return path


@pytest.mark.parametrize(("manifest", "reason"), [
    ("{not json", "Expecting property name"),
    ({"version": "1.0.0"}, "'files'"),
    ({"files": []}, "'version'"),
    ({"version": "1", "files": [{"path": "a", "size": 1}]},
     "a file entry lacks path, size or sha256"),
    ({"version": "1", "files": "abc"}, "a file entry lacks path, size or sha256"),
    ({"version": "1", "format": staging.MANIFEST_FORMAT, "fingerprint": "0" * 16,
      "files": [{"path": "a", "size": 1, "sha256": "0" * 64}]},
     "its fingerprint is not the one of the files it lists"),
])
def test_a_corrupted_staging_manifest_is_a_dataset_error_saying_how_to_fix_it(
        tmp_path, manifest, reason):
    path = _write_manifest(tmp_path, manifest)
    with pytest.raises(DatasetError) as err:
        staging.read_manifest(path)
    assert str(err.value).startswith(f"staging manifest {path} is corrupted (")
    assert reason in str(err.value)
    assert str(err.value).endswith(f"; delete {tmp_path} and stage again")


def test_a_staging_manifest_of_the_current_format_reads_back(tmp_path):
    files = [{"path": "a", "size": 1, "sha256": "0" * 64}]
    path = _write_manifest(tmp_path, {
        "version": 1, "format": staging.MANIFEST_FORMAT, "files": files,
        "fingerprint": manifest.fingerprint(files, ignore_names=("dataset_info.json",))})
    assert staging.read_manifest(path)["version"] == "1"  # a version is always a string


def test_the_manifest_module_lists_fingerprints_and_checks_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"bb")
    (tmp_path / "a.txt").write_bytes(b"a")
    (tmp_path / "dataset_info.json").write_text("{}")
    entries = manifest.list_files(tmp_path, skip=lambda p: p.name == "a.txt")
    assert [e["path"] for e in entries] == ["dataset_info.json", "sub/b.bin"]
    assert entries[1] == {"path": "sub/b.bin", "size": 2,
                          "sha256": hashlib.sha256(b"bb").hexdigest()}
    assert manifest.well_formed(entries) and not manifest.well_formed([{"path": "x"}])
    # Bookkeeping files can be left out of the fingerprint; content files cannot.
    content_only = manifest.fingerprint(entries, ignore_names=("dataset_info.json",))
    assert content_only == manifest.fingerprint(entries[1:])
    assert content_only != manifest.fingerprint(entries)
    assert len(content_only) == 16
    assert manifest.first_bad(tmp_path, entries) is None
    (tmp_path / "sub" / "b.bin").write_bytes(b"bc")
    bad = manifest.first_bad(tmp_path, entries)
    assert (bad.path, bad.found) == (tmp_path / "sub" / "b.bin",
                                     (2, hashlib.sha256(b"bc").hexdigest()))
    (tmp_path / "dataset_info.json").unlink()
    bad = manifest.first_bad(tmp_path, entries)
    assert (bad.entry["path"], bad.found) == ("dataset_info.json", None)
    assert manifest.dumps({"b": 1, "a": [1]}) == b'{\n  "a": [\n    1\n  ],\n  "b": 1\n}\n'
