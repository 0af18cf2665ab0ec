"""A team's own labelled images, staged by date partition from a directory and from S3
over HTTP, then checked before training: skip when nothing is new, refuse bad data."""

from __future__ import annotations

import io
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training import layout
from training.config import RunConfig
from training.data.snapshot import staging
from training.data.sources.images import select_partitions, split_of
from training.errors import DatasetError, ValidationError
from training.registry import open_store
from training.registry.versions import ModelRegistry
from training.steps import validate

pytestmark = pytest.mark.slow

DAYS = ("2026-11-28", "2026-11-29", "2026-11-30")


def png(seed: int, shift: int = 0) -> bytes:
    """A 10x12 grey image (another size than the model's: staging resizes)."""
    pixels = np.random.default_rng(seed).integers(0, 128, (10, 12)) + shift
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


def land(store, day: str, *, labels=("cat", "dog"), per_label=15, shift=0,
         complete=True) -> None:
    """One partition as a lander writes it: the images, then _SUCCESS last."""
    for label in labels:
        for i in range(per_label):
            seed = zlib.crc32(f"{day}/{label}/{i}".encode())
            store.put_bytes(f"dt={day}/{label}/{i}.png", png(seed, shift))
    if complete:
        store.put_bytes(f"dt={day}/_SUCCESS", json.dumps({"day": day}).encode())


def own(data_uri: str, tmp_path: Path, **flat) -> RunConfig:
    return RunConfig.from_flat({
        "dataset": "pets", "data_source": "images", "data_uri": data_uri,
        "image_shape": "8x8x1", "staging_dir": os.fspath(tmp_path / "staging"),
        "store_uri": os.fspath(tmp_path / "store"), "min_examples_per_class": 3, **flat})


def manifest_of(staged) -> dict:
    return json.loads((Path(staged.path) / layout.STAGING_MANIFEST).read_text())


def test_partitions_are_chosen_by_the_runs_day_and_window():
    folders = [f"dt={d}" for d in DAYS] + ["dt=2026-12-01", "notes", "dt=bad", "dt=2026-13-45"]
    assert select_partitions(folders, "2026-11-29", 0) == ["dt=2026-11-28", "dt=2026-11-29"]
    assert select_partitions(folders, "2026-11-30", 2) == ["dt=2026-11-29", "dt=2026-11-30"]
    assert select_partitions(folders, None, 0) == [f"dt={d}" for d in DAYS] + ["dt=2026-12-01"]


def test_an_images_split_never_changes_and_follows_its_bytes():
    data = [png(seed) for seed in range(400)]
    splits = [split_of(d, 20, 10) for d in data]
    assert splits == [split_of(d, 20, 10) for d in data]
    shares = {s: splits.count(s) / len(splits) for s in ("train", "validation", "test")}
    assert 0.12 < shares["test"] < 0.28 and 0.04 < shares["validation"] < 0.16


@pytest.mark.parametrize("where", ["directory", "s3"])
def test_growing_partitions_stage_as_snapshots_and_a_rerun_is_identical(
        where, tmp_path, s3_server, bucket):
    if where == "s3":
        uri, options = f"s3://{bucket}/team/images", s3_server.options()
    else:
        uri, options = os.fspath(tmp_path / "incoming"), None
    store = open_store(uri, options)
    land(store, DAYS[0])
    land(store, DAYS[1])
    store.put_bytes(f"dt={DAYS[1]}/cat/broken.png", b"not an image")  # before _SUCCESS
    land(store, DAYS[2], complete=False)  # still landing

    first = staging.stage(own(uri, tmp_path, data_until=DAYS[1]).dataset, options)
    meta = manifest_of(first)
    assert meta["partitions"] == [f"dt={DAYS[0]}", f"dt={DAYS[1]}"]
    assert meta["labels"] == ["cat", "dog"] and meta["attempted"] == 61
    assert meta["rejected"] == [{"path": f"dt={DAYS[1]}/cat/broken.png", "reason":
                                 "not a readable image: Pillow knows no such image format"}]
    assert sum(meta["examples"].values()) == 60
    # the same night again: the same snapshot, nothing prepared
    again = staging.stage(own(uri, tmp_path, data_until=DAYS[1]).dataset, options)
    assert again == first
    # a landed partition makes a new snapshot; no image changed split
    store.put_bytes(f"dt={DAYS[2]}/_SUCCESS", b"{}")
    grown = staging.stage(own(uri, tmp_path, data_until=DAYS[2]).dataset, options)
    assert grown.path != first.path and grown.fingerprint != first.fingerprint
    assert sum(manifest_of(grown)["examples"].values()) == 90
    window = staging.stage(own(uri, tmp_path, data_until=DAYS[2], window_days=1).dataset,
                           options)
    assert manifest_of(window)["partitions"] == [f"dt={DAYS[2]}"]
    with pytest.raises(DatasetError, match=r"has no complete dt=YYYY-MM-DD partition "
                                           r"\(with _SUCCESS\) up to 2026-11-27"):
        staging.stage(own(uri, tmp_path, data_until="2026-11-27").dataset, options)


def publish_production(registry: ModelRegistry, cfg: RunConfig, staged, data_stats,
                       tmp_path: Path, version: str = "v1") -> None:
    """What a published production version holds for the data checks."""
    model = tmp_path / version
    model.mkdir()
    (model / layout.RUN).write_text(json.dumps({"dataset": staged.to_dict()}))
    cfg.write(model)
    (model / layout.DATA_STATS).write_text(json.dumps(data_stats))
    registry.publish(cfg.model_name, version, model, run_id=version,
                     created="2026-11-29T03:00:00+00:00")
    registry.promote(cfg.model_name, version, run_id=version, at="2026-11-29T03:00:00+00:00",
                     reason="test", forced=True)


def test_nothing_new_skips_new_data_is_checked_and_bad_data_is_refused(tmp_path):
    uri = os.fspath(tmp_path / "incoming")
    store = open_store(uri)
    land(store, DAYS[0])
    registry = ModelRegistry(open_store(os.fspath(tmp_path / "store")), check_model=False)
    cfg = own(uri, tmp_path, data_until=DAYS[0])
    staged = staging.stage(cfg.dataset)
    # staging keeps the snapshot's statistics, so validate_data needs no TensorFlow
    kept = manifest_of(staged)["statistics"][staging.statistics_key(0.1)]
    assert sum(s["num_examples"] for s in kept["splits"].values()) == 30
    # the first model: no production to compare with; every check passes
    checked = validate.validate_data(cfg, staged, registry)
    assert checked["skip"] is False and checked["data_stats"]["verdict"]["passed"]
    assert checked["data_stats"]["compared_with"] is None
    publish_production(registry, cfg, staged, checked["data_stats"], tmp_path)

    # the same night again: nothing new, training is skipped with the reason
    skipped = validate.validate_data(cfg, staged, registry)
    assert skipped["skip"] is True
    assert skipped["reason"].startswith(f"nothing new: production (pets-mlp v1) was trained "
                                        f"on this data ({staged.key}) with these settings")
    # ... unless forced, or the settings changed
    assert not validate.validate_data(cfg.with_overrides({"force_train": True}), staged,
                                  registry)["skip"]
    assert not validate.validate_data(cfg.with_overrides({"epochs": 3}), staged, registry)["skip"]

    # a new day like the first: checked against production, passes
    land(store, DAYS[1])
    cfg2 = own(uri, tmp_path, data_until=DAYS[1])
    fine = validate.validate_data(cfg2, staging.stage(cfg2.dataset), registry)
    assert fine["skip"] is False and fine["data_stats"]["compared_with"] == "v1"

    # a drifted day with a class missing: refused before training, every reason named
    land(store, DAYS[2], labels=("cat",), per_label=40, shift=120)
    cfg3 = own(uri, tmp_path, data_until=DAYS[2], window_days=1)
    with pytest.raises(ValidationError) as refused:
        validate.validate_data(cfg3, staging.stage(cfg3.dataset), registry)
    message = str(refused.value)
    assert message.startswith("the staged data failed validation")
    assert "schema:" in message and "'dog'" in message  # production's class is missing
    assert "drift:" in message


def test_landed_partitions_stage_exactly_what_was_landed(tmp_path):
    """The lander's marker lists its files: leftovers are not data, and a partition
    being replaced waits for its new marker."""
    from training.data.sources.demo import write_demo_partitions
    from training.data.sources.landing import land

    incoming, uri = tmp_path / "incoming", os.fspath(tmp_path / "landed")
    write_demo_partitions(incoming, start=DAYS[0], days=2, drift_day=0)
    for day in DAYS[:2]:
        land(incoming, uri, f"dt={day}")
    store = open_store(uri)
    store.put_bytes(f"dt={DAYS[0]}/0/leftover.png", png(1))  # not in the marker
    cfg = own(uri, tmp_path, data_until=DAYS[1])
    staged = manifest_of(staging.stage(cfg.dataset))
    landed = sum(json.loads(store.get_bytes(f"dt={d}/_SUCCESS"))["files"] for d in DAYS[:2])
    assert staged["attempted"] == landed and staged["rejected"] == []
    assert staged["labels"] == [str(n) for n in range(10)]
    store.put_bytes(f"dt={DAYS[1]}/_SUCCESS", json.dumps({"state": "replacing"}).encode())
    replacing = manifest_of(staging.stage(cfg.dataset))
    assert replacing["partitions"] == [f"dt={DAYS[0]}"]


def test_tfrecord_partitions_stage_like_image_files(tmp_path):
    """data_source tfrecord: tf.train.Example with encoded 'image' bytes and a 'label'
    (a name, or an int64), one or more files per partition."""
    import tensorflow as tf

    uri = os.fspath(tmp_path / "records")
    store = open_store(uri)

    def example(image: bytes, label) -> bytes:
        feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))}
        feature["label"] = (tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
                            if isinstance(label, int) else
                            tf.train.Feature(bytes_list=tf.train.BytesList(value=[label])))
        return tf.train.Example(features=tf.train.Features(feature=feature)
                                ).SerializeToString()

    local = tmp_path / "shard.tfrecord"
    with tf.io.TFRecordWriter(os.fspath(local)) as writer:
        for i in range(20):
            writer.write(example(png(i), b"cat" if i % 2 else b"dog"))
        writer.write(example(b"not an image", b"cat"))
    store.put_bytes(f"dt={DAYS[0]}/part-0.tfrecord", local.read_bytes())
    store.put_bytes(f"dt={DAYS[0]}/_SUCCESS", b"")  # another tool's empty marker
    cfg = own(uri, tmp_path, data_source="tfrecord")
    staged = staging.stage(cfg.dataset)
    meta = manifest_of(staged)
    assert meta["labels"] == ["cat", "dog"] and meta["attempted"] == 21
    assert [r["path"] for r in meta["rejected"]] == [f"dt={DAYS[0]}/part-0.tfrecord#20"]
    assert sum(meta["examples"].values()) == 20
    staging.verify(staged)


def test_a_pinned_holdout_on_s3_is_read_whole_and_a_changed_or_foreign_file_is_named(
        s3_server):
    from training.data.snapshot.holdout import load_holdout

    bucket = s3_server.create_bucket()
    uri = f"s3://{bucket}/team/holdout"
    store = open_store(uri, s3_server.options())
    for label in ("cat", "dog"):
        for i in range(4):
            store.put_bytes(f"{label}/{i}.png", png(zlib.crc32(f"h/{label}/{i}".encode())))
    store.put_bytes("_README", b"bookkeeping is not an image")

    holdout = load_holdout(uri, s3_server.options(), (8, 8, 1), ["cat", "dog"])
    assert holdout.images.shape == (8, 8, 8, 1) and holdout.images.dtype == np.uint8
    assert holdout.labels.tolist() == [0] * 4 + [1] * 4  # by the dataset's class order
    again = load_holdout(uri, s3_server.options(), (8, 8, 1), ["cat", "dog"])
    assert again.fingerprint == holdout.fingerprint  # the same images: the same name

    store.put_bytes("dog/0.png", png(1, shift=40))  # one image replaced behind its back
    changed = load_holdout(uri, s3_server.options(), (8, 8, 1), ["cat", "dog"])
    assert changed.fingerprint != holdout.fingerprint

    store.put_bytes("cat/9.png", b"not a png")
    with pytest.raises(DatasetError, match=r"cat/9.png is not a readable image"):
        load_holdout(uri, s3_server.options(), (8, 8, 1), ["cat", "dog"])
    foreign = open_store(f"{uri}-2", s3_server.options())
    foreign.put_bytes("bird/0.png", png(2))
    with pytest.raises(DatasetError, match=r"label 'bird' \(bird/0.png\) is not a class of "
                                           r"the dataset; its classes are cat, dog"):
        load_holdout(f"{uri}-2", s3_server.options(), (8, 8, 1), ["cat", "dog"])
