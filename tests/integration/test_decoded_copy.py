"""``dataset.decoded_copy``: the staged splits decoded once to disk, read back as pixels.

A copy of the session's staged ``digits`` gets its decoded copy from the real stage step
(``training.steps.stage``), then: the copy holds exactly the pixels and labels, in the
same order, that decoding the shards gives (the NumPy reader, tf.data, and the JAX
input's memory-mapped batches); the staged shards' manifest and fingerprint are
untouched; a flipped byte and a missing file are refused by name; a stale copy is
rewritten (over files renamed into place: a reader's memory map keeps the old); a copy
written in small chunks is the same copy; a run, or a step handed a staged dataset, that
asks for a copy that is not there is refused; a JAX training run reading the copy
ends with the same weights as one decoding the shards; and a team's snapshot of landed
images gets its copy too, read the same by both backends.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.cli import cli, last_json
from support.jax_training import train_in_jax

from training.config import RunConfig
from training.data.input import decoded_copy
from training.data.input.choose import load_builder, make_dataset
from training.data.input.staged_arrays import StagedArrays
from training.data.snapshot import staging
from training.data.snapshot.splits import split_names
from training.data.snapshot.staging import StagedDataset
from training.errors import DatasetError
from training.steps import stage
from training.train import fused_steps

pytestmark = pytest.mark.slow


def _config(staging_dir: str, **settings) -> RunConfig:
    return RunConfig.from_flat({"staging_dir": staging_dir, "decoded_copy": True,
                                **settings})


@pytest.fixture(scope="module")
def staged(staged_digits, tmp_path_factory) -> StagedDataset:
    """The session's staged digits, copied, with its decoded copy made by the stage step."""
    staging_dir = tmp_path_factory.mktemp("decoded-staging")
    shutil.rmtree(staging_dir)
    shutil.copytree(staged_digits.staging_dir, staging_dir)
    cfg = _config(os.fspath(staging_dir))
    assert stage.cached(cfg) is None  # staged, but without the copy this config asks for
    result = stage.stage(cfg)
    assert stage.cached(cfg) == result
    return result


def _splits(staged: StagedDataset) -> list[str]:
    return list(split_names(StagedArrays(staged), 0.1).values())


def test_the_stage_step_writes_every_training_split_and_leaves_the_staging_manifest(
        staged, staged_digits):
    index = json.loads((Path(staged.path) / "decoded" / "index.json").read_text())
    assert sorted(index["splits"]) == sorted(_splits(staged))
    assert index["fingerprint"] == staged.fingerprint == staged_digits.fingerprint
    staging.verify(staged)  # the shards' manifest does not list the copy: still whole
    manifest = json.loads((Path(staged.path) / "staging-manifest.json").read_text())
    assert not [e for e in manifest["files"] if e["path"].startswith("decoded/")]
    assert decoded_copy.ensure(Path(staged.path), _splits(staged)) == []  # nothing twice


def test_the_copy_holds_the_decoded_pixels_and_labels_in_the_readers_order(staged):
    reader = StagedArrays(staged)
    for split in _splits(staged):
        copy = decoded_copy.find(Path(staged.path), split)
        images, labels = reader.arrays(split)
        assert copy.shape == images.shape[1:]
        np.testing.assert_array_equal(np.asarray(copy.images()), images)
        np.testing.assert_array_equal(copy.labels, labels)


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_tf_data_reads_the_copy_as_it_decodes_the_shards(staged, cache):
    builder = load_builder(staged)
    split = split_names(builder, 0.1)["train"]
    examples = StagedArrays(staged).num_examples(split)

    def batches(decoded: bool) -> list:
        ds = make_dataset(builder, split, global_batch_size=100, shuffle=True, seed=3,
                          cache=cache, decoded=decoded)
        assert int(ds.cardinality()) == -(-examples // 100)  # Keras knows an epoch's length
        return [(x.numpy(), y.numpy()) for x, y in ds]

    for (x1, y1), (x2, y2) in zip(batches(False), batches(True), strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_the_jax_input_gathers_batches_from_the_memory_map(staged):
    from training.data.input.numpy_reader import SplitBatches

    reader = StagedArrays(staged)
    split = _splits(staged)[0]
    copy = decoded_copy.find(Path(staged.path), split)
    batches = {  # per batch from the memory map; the copy read into memory (cached)
        keep: SplitBatches(reader, split, global_batch_size=64, shuffle=True, seed=5,
                           keep_decoded=keep, decoded=copy, augment=("flip",))
        for keep in (False, True)}
    decoding = SplitBatches(reader, split, global_batch_size=64, shuffle=True, seed=5,
                            keep_decoded=False, augment=("flip",))
    assert isinstance(batches[False].images, np.memmap) and batches[False].encoded is None
    assert not isinstance(batches[True].images, np.memmap)
    for _ in range(2):  # epochs
        for index in range(len(decoding)):
            for mapped in batches.values():
                for a, b in zip(mapped[index], decoding[index], strict=True):
                    np.testing.assert_array_equal(a, b)
        for each in (*batches.values(), decoding):
            each.on_epoch_end()


def test_a_copy_written_in_small_chunks_is_the_same_copy(staged, tmp_path, monkeypatch):
    path = _tampered_copy(staged, tmp_path)
    before = json.loads((path / "decoded" / "index.json").read_text())
    shutil.rmtree(path / "decoded")
    image_bytes = int(np.prod(StagedArrays(staged).info.image_shape))
    monkeypatch.setattr(decoded_copy, "WRITE_BYTES", 100 * image_bytes)  # 100-image chunks
    assert decoded_copy.ensure(path, _splits(staged)) == _splits(staged)
    assert json.loads((path / "decoded" / "index.json").read_text()) == before
    assert not list((path / "decoded").glob("*.tmp"))


def _tampered_copy(staged: StagedDataset, tmp_path: Path) -> Path:
    """A copy of the staged dataset's directory (its decoded copy included)."""
    path = tmp_path / "digits-copy"
    shutil.copytree(staged.path, path)
    return path


def test_a_flipped_byte_in_the_copy_is_refused_by_name_and_nothing_else_is_lost(
        staged, tmp_path):
    path = _tampered_copy(staged, tmp_path)
    split = _splits(staged)[1]
    pixels = decoded_copy.find(path, split).pixels
    data = bytearray(pixels.read_bytes())
    data[len(data) // 2] ^= 0x01
    pixels.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=rf"decoded copy file {pixels} is corrupted.*"
                       rf"split {split}.*delete {path / 'decoded'} and stage again"):
        decoded_copy.find(path, split)
    assert decoded_copy.find(path, _splits(staged)[0]) is not None  # the others still read
    shutil.rmtree(path / "decoded")  # what the error says to do
    assert decoded_copy.ensure(path, _splits(staged)) == _splits(staged)
    assert decoded_copy.find(path, split).pixels.read_bytes() == \
        decoded_copy.find(Path(staged.path), split).pixels.read_bytes()


def test_a_missing_file_is_refused_by_name(staged, tmp_path):
    path = _tampered_copy(staged, tmp_path)
    split = _splits(staged)[2]
    labels = path / "decoded" / decoded_copy.find(path, split).pixels.with_suffix(
        ".labels").name
    labels.unlink()
    with pytest.raises(DatasetError, match=rf"decoded copy file {labels} is missing"):
        decoded_copy.find(path, split)


def test_a_copy_of_other_content_is_stale_and_written_again(staged, tmp_path):
    path = _tampered_copy(staged, tmp_path)
    index_path = path / "decoded" / "index.json"
    index = json.loads(index_path.read_text())
    mapped = decoded_copy.find(path, _splits(staged)[0]).images()  # a reader of the old
    old, old_file = np.array(mapped), os.stat(mapped.filename)
    index_path.write_text(json.dumps({**index, "fingerprint": "0" * 16}))
    assert decoded_copy.find(path, _splits(staged)[0]) is None
    assert decoded_copy.missing(path, _splits(staged)) == _splits(staged)
    assert decoded_copy.ensure(path, _splits(staged)) == _splits(staged)
    assert json.loads(index_path.read_text())["fingerprint"] == staged.fingerprint
    new_file = os.stat(mapped.filename)  # a new file renamed over, not the old rewritten
    assert (new_file.st_dev, new_file.st_ino) != (old_file.st_dev, old_file.st_ino)
    np.testing.assert_array_equal(mapped, old)  # the old file, still mapped, is whole
    for split in _splits(staged):
        np.testing.assert_array_equal(
            decoded_copy.find(path, split).images(),
            decoded_copy.find(Path(staged.path), split).images())


def test_a_run_asking_for_a_copy_that_is_not_there_is_refused(staged_digits):
    builder = load_builder(staged_digits)  # the session's staged digits: no copy
    with pytest.raises(DatasetError, match=r"dataset.decoded_copy is true, but dataset "
                       r"digits staged at .* has no decoded copy of split 'test': stage it "
                       r"again with this config .* or set dataset.decoded_copy to false"):
        make_dataset(builder, "test", global_batch_size=64, shuffle=False, seed=0,
                     decoded=True)


def test_a_step_handed_a_dataset_without_the_copy_stops_before_training(
        staged_digits, tmp_path):
    handed = tmp_path / "staged.json"  # what `python -m training stage` printed
    handed.write_text(json.dumps({"staged": staged_digits.to_dict()}))
    cfg = _config(staged_digits.staging_dir)
    with pytest.raises(DatasetError, match=r"dataset.decoded_copy is true, but dataset "
                       rf"{staged_digits.key} handed over in --staged {handed} has no "
                       r"decoded copy of split\(s\) 'train', 'validation', 'test': stage it "
                       r"with this config"):
        stage.stage(cfg, os.fspath(handed))
    assert not (Path(staged_digits.path) / "decoded").exists()  # nothing written there
    plain = RunConfig.from_flat({"staging_dir": staged_digits.staging_dir})
    assert stage.stage(plain, os.fspath(handed)) == staged_digits


def test_jax_training_from_the_copy_ends_as_training_from_the_shards(staged, tmp_path):
    flat = {"staging_dir": staged.staging_dir, "output_dir": os.fspath(tmp_path / "runs"),
            "backend": "jax", "epochs": 2, "batch_size": 64, "seed": 7,
            "devices": ["/cpu:0"], "early_stopping_patience": 50,
            "reduce_lr_patience": 50}
    runs = {  # on the host, decoded per batch; on the device (input_cache auto)
        "shards": {**flat, "run_id": "shards", "input_cache": "none"},
        "copy": {**flat, "run_id": "copy", "input_cache": "none", "decoded_copy": True},
        "shards_device": {**flat, "run_id": "shards-device"},
        "copy_device": {**flat, "run_id": "copy-device", "decoded_copy": True},
    }
    trained = train_in_jax(staged, runs, tmp_path, devices=1)
    for shards, copy in (("shards", "copy"), ("shards_device", "copy_device")):
        for a, b in zip(trained.weights[shards], trained.weights[copy], strict=True):
            np.testing.assert_array_equal(a, b)
    for run_id, where in (("copy", "host"), ("copy-device", "device")):
        run = json.loads((tmp_path / "runs" / run_id / "model" / "run.json").read_text())
        loop = None if where == "host" else {  # the split on the device: the CPU's loop
            "form": "unrolled", "platform": "cpu", "why": fused_steps.CPU_WHY}
        assert run["input"] == {"train": where, "decoded_copy": True, "loop": loop}
    assert trained.report["tensorflow_modules"] == []


def test_the_cli_trains_and_evaluates_on_tensorflow_from_the_copy(staged, tmp_path):
    proc = cli(tmp_path, "train", "--staging-dir", staged.staging_dir, "--output-dir",
               os.fspath(tmp_path / "runs"), "--store-uri", os.fspath(tmp_path / "store"),
               "--decoded-copy", "--input-cache", "none", "--epochs", "2", "--evaluate")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ran out of data" not in proc.stderr  # Keras knew each epoch's length
    assert "input test: not cached (dataset.input_cache is 'none': read from its decoded " \
           "copy every epoch)" in proc.stderr
    trained = last_json(proc.stdout, "trained")["trained"]
    run = json.loads((Path(trained["run_dir"]) / "model" / "run.json").read_text())
    assert run["input"] == {"train": "host", "decoded_copy": True, "loop": None}
    assert last_json(proc.stdout, "evaluation")["test_accuracy"] > 0.8


def test_a_teams_snapshot_gets_its_copy_and_both_backends_read_it(tmp_path):
    from training.data.sources.demo import write_demo_partitions
    from training.data.sources.landing import land

    incoming, uri = tmp_path / "incoming", os.fspath(tmp_path / "landed")
    write_demo_partitions(incoming, start="2026-11-28", days=2, drift_day=0)
    for day in ("2026-11-28", "2026-11-29"):
        land(incoming, uri, f"dt={day}")
    cfg = RunConfig.from_flat({
        "dataset": "pets", "data_source": "images", "data_uri": uri,
        "data_until": "2026-11-29", "image_shape": "28x28x1", "decoded_copy": True,
        "staging_dir": os.fspath(tmp_path / "staging")})
    staged = stage.stage(cfg)
    reader, builder = StagedArrays(staged), load_builder(staged)
    splits = list(split_names(reader, 0.1).values())
    assert decoded_copy.missing(Path(staged.path), splits) == []
    for split in splits:
        images, labels = reader.arrays(split)
        assert len(labels) > 0
        copy = decoded_copy.find(Path(staged.path), split)
        np.testing.assert_array_equal(copy.images(), images)
        np.testing.assert_array_equal(copy.labels, labels)
        read = [make_dataset(builder, split, global_batch_size=32, shuffle=False, seed=0,
                             cache="none", decoded=decoded) for decoded in (False, True)]
        for a, b in zip(*read, strict=True):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x.numpy(), y.numpy())
