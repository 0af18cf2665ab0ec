"""Incremental staging of a team's data: each partition decoded once into shards of its
own, a night's snapshot the list of its partitions' shards, statistics composed from
the partitions' records, a replaced partition re-staged, a tampered shard refused, and
the clean-up command removing only what nothing refers to."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from training import layout
from training.config import RunConfig
from training.data.input.choose import load_builder, make_dataset
from training.data.snapshot import staging
from training.data.snapshot.splits import split_names
from training.data.snapshot.statistics import dataset_statistics
from training.data.sources.landing import land
from training.errors import DatasetError
from training.registry import open_store

pytestmark = pytest.mark.slow

DAYS = ("2026-11-28", "2026-11-29", "2026-11-30")
ROOT = Path(__file__).resolve().parents[2]


def png(seed: int, shift: int = 0) -> bytes:
    import io

    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 128, (10, 12)) + shift
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


def write_day(source: Path, day: str, *, labels=("cat", "dog"), per_label=12,
              shift=0) -> None:
    for label in labels:
        for i in range(per_label):
            path = source / f"dt={day}" / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png(zlib.crc32(f"{day}/{label}/{i}".encode()), shift))


def land_day(source: Path, uri: str, day: str, replace: bool = False, **images) -> None:
    write_day(source, day, **images)
    land(source, uri, f"dt={day}", replace=replace)


def own(uri: str, tmp_path: Path, **flat) -> RunConfig:
    return RunConfig.from_flat({
        "dataset": "pets", "data_source": "images", "data_uri": uri,
        "image_shape": "8x8x1", "staging_dir": os.fspath(tmp_path / "staging"),
        "store_uri": os.fspath(tmp_path / "store"), "output_dir": os.fspath(tmp_path / "runs"),
        "min_examples_per_class": 3, **flat})


def manifest_of(staged) -> dict:
    return json.loads((Path(staged.path) / layout.STAGING_MANIFEST).read_text())


def partitions(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "staging" / "pets" / "partitions").iterdir())


@pytest.fixture
def three_days(tmp_path):
    uri, source = os.fspath(tmp_path / "incoming"), tmp_path / "source"
    for day in DAYS:
        land_day(source, uri, day)
    return uri, source


def test_a_new_night_decodes_only_its_new_partition_and_reads_like_the_images(
        tmp_path, three_days, caplog):
    uri, _ = three_days
    first = staging.stage(own(uri, tmp_path, data_until=DAYS[1]).dataset)
    assert len(partitions(tmp_path)) == 2
    with caplog.at_level(logging.INFO, logger="training.data.snapshot.own_snapshot"):
        grown = staging.stage(own(uri, tmp_path, data_until=DAYS[2]).dataset)
    assert "3 partitions, 1 decoded now, 2 reused" in caplog.text
    assert len(partitions(tmp_path)) == 3
    # the two snapshots share the first days' shards: the same file, linked
    old, new = Path(first.path), Path(grown.path)
    shared = manifest_of(first)["partition_dirs"]
    assert shared == manifest_of(grown)["partition_dirs"][:2]
    for name in shared:
        assert (old / name / "train.tfrecord").stat().st_ino == \
            (new / name / "train.tfrecord").stat().st_ino
    staging.verify(first)
    staging.verify(grown)
    # the statistics composed from the partitions' records are those read from images
    meta = manifest_of(grown)
    builder = load_builder(grown)
    read = dataset_statistics(builder, split_names(builder, 0.1))
    composed = meta["statistics"][staging.statistics_key(0.1)]
    assert composed["label_names"] == read["label_names"] == ["cat", "dog"]
    assert composed["duplicates"] == read["duplicates"]
    for split in ("train", "validation", "test"):
        for field in ("num_examples", "class_counts", "image_shape", "image_dtype"):
            assert composed["splits"][split][field] == read["splits"][split][field]
        assert np.allclose(composed["splits"][split]["pixel_mean"],
                           read["splits"][split]["pixel_mean"])
        assert np.allclose(composed["splits"][split]["pixel_std"],
                           read["splits"][split]["pixel_std"])
    assert sorted(meta["partition_statistics"]) == [f"dt={d}" for d in DAYS]
    assert sum(p["num_examples"] for p in meta["partition_statistics"].values()) == 72
    # training reads every example of every day once, cached or not, with its label
    for cache in ("memory", "none"):
        seen = [(int(label), image.tobytes()) for images, labels in tfds.as_numpy(
            make_dataset(builder, "train", global_batch_size=7, shuffle=True, seed=1,
                         cache=cache, shuffle_buffer=5))
            for image, label in zip(images, labels, strict=True)]
        assert len(seen) == meta["examples"]["train"]
        assert sorted(seen) == sorted((int(lb), im.tobytes()) for im, lb in tfds.as_numpy(
            builder.as_dataset("train")))


def test_a_replaced_partition_gets_new_shards_and_the_old_snapshot_keeps_its_own(
        tmp_path, three_days):
    uri, source = three_days
    before = staging.stage(own(uri, tmp_path).dataset)
    old_dirs = partitions(tmp_path)
    land_day(source, uri, DAYS[1], replace=True, shift=90, labels=("cat", "dog", "eel"))
    after = staging.stage(own(uri, tmp_path).dataset)
    assert after.path != before.path
    now = partitions(tmp_path)
    assert len(now) == 4 and set(old_dirs) < set(now)  # one new, the old one kept
    assert manifest_of(after)["labels"] == ["cat", "dog", "eel"]
    assert manifest_of(before)["labels"] == ["cat", "dog"]
    staging.verify(before)
    staging.verify(after)
    # the eel's index is the snapshot's: day 1 and 3 were staged without it
    labels = [int(lb) for _, lb in tfds.as_numpy(load_builder(after).as_dataset("train"))]
    assert set(labels) == {0, 1, 2}


def test_a_changed_byte_in_a_partition_shard_is_refused_and_a_truncated_one_at_staging(
        tmp_path, three_days):
    uri, _ = three_days
    staged = staging.stage(own(uri, tmp_path).dataset)
    shard = (tmp_path / "staging" / "pets" / "partitions" / partitions(tmp_path)[0]
             / "train.tfrecord")
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(data)  # the same inode: every snapshot linking it sees it
    with pytest.raises(DatasetError, match=r"staged file .*train\.tfrecord is corrupted"):
        staging.verify(staged)
    shard.write_bytes(data[:-10])
    (Path(staged.path) / layout.STAGING_MANIFEST).unlink()  # stage that night again
    with pytest.raises(DatasetError, match=r"staged partition .* lost or changed "
                                           r"train\.tfrecord: delete the directory"):
        staging.stage(own(uri, tmp_path).dataset)


def clean_staging(tmp_path: Path, *extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "training", "clean-staging", "--staging-dir",
         os.fspath(tmp_path / "staging"), "--output-dir", os.fspath(tmp_path / "runs"),
         "--store-uri", os.fspath(tmp_path / "store"), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_clean_staging_removes_only_what_no_run_production_or_kept_snapshot_uses(
        tmp_path, three_days):
    uri, source = three_days
    used = staging.stage(own(uri, tmp_path, data_until=DAYS[0]).dataset)
    unused = staging.stage(own(uri, tmp_path, data_until=DAYS[1]).dataset)
    run = tmp_path / "runs" / "night-1" / layout.MODEL_DIR
    run.mkdir(parents=True)
    (run / layout.RUN).write_text(json.dumps({"dataset": used.to_dict()}))
    land_day(source, uri, DAYS[1], replace=True, shift=60)
    latest = staging.stage(own(uri, tmp_path).dataset)
    assert len(partitions(tmp_path)) == 4
    replaced = manifest_of(unused)["partition_dirs"][1]

    listed = clean_staging(tmp_path, "--dry-run")
    assert listed["removed_snapshots"] == [unused.path]
    assert listed["removed_partitions"] == [
        os.fspath(tmp_path / "staging" / "pets" / "partitions" / replaced)]
    assert Path(unused.path).is_dir() and len(partitions(tmp_path)) == 4

    report = clean_staging(tmp_path)
    assert report["removed_snapshots"] == [unused.path] and report["freed_bytes"] > 0
    assert not Path(unused.path).exists() and replaced not in partitions(tmp_path)
    assert sorted(report["kept_snapshots"]) == sorted([used.path, latest.path])
    staging.verify(used)  # what the run used and tonight's snapshot are whole
    staging.verify(latest)
    # nothing refers to the first night once its run is gone: with nothing kept, it goes
    (run / layout.RUN).unlink()
    report = clean_staging(tmp_path, "--keep-latest", "0")
    assert sorted(report["removed_snapshots"]) == sorted([used.path, latest.path])
    assert partitions(tmp_path) == []
    # staging again starts over and reads the same
    again = staging.stage(own(uri, tmp_path).dataset)
    assert again.fingerprint == latest.fingerprint


def test_days_are_found_by_folder_and_a_partition_from_s3_is_staged(tmp_path, s3_server, bucket):
    uri = f"s3://{bucket}/team/incremental"
    store = open_store(uri, s3_server.options())
    source = tmp_path / "source"
    write_day(source, DAYS[0], per_label=40)
    land(source, uri, f"dt={DAYS[0]}", store_options=s3_server.options())
    store.put_bytes(f"dt={DAYS[1]}/cat/0.png", png(1))  # a day still landing
    assert store.list_folders("") == [f"dt={DAYS[0]}", f"dt={DAYS[1]}"]
    assert store.list_folders(f"dt={DAYS[0]}/") == ["cat", "dog"]
    staged = staging.stage(own(uri, tmp_path).dataset, s3_server.options())
    assert manifest_of(staged)["partitions"] == [f"dt={DAYS[0]}"]
    assert sum(manifest_of(staged)["examples"].values()) == 80
    staging.verify(staged)
    local = open_store(os.fspath(tmp_path / "local"))
    local.put_bytes(f"dt={DAYS[0]}/cat/0.png", b"x")
    local.put_bytes("notes.txt", b"x")
    assert local.list_folders("") == [f"dt={DAYS[0]}"] and local.list_folders("nope/") == []


def test_images_landed_at_the_staged_shape_are_kept_as_landed_and_read_the_same(tmp_path):
    import io

    from PIL import Image

    source, uri = tmp_path / "source", os.fspath(tmp_path / "incoming")
    landed = {}
    for i in range(20):
        pixels = np.random.default_rng(i).integers(0, 256, (8, 8)).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="PNG")
        path = source / f"dt={DAYS[0]}" / ("a" if i % 2 else "b") / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(out.getvalue())
        landed[pixels.tobytes()] = out.getvalue()
    land(source, uri, f"dt={DAYS[0]}")
    staged = staging.stage(own(uri, tmp_path, test_percent=30, validation_percent=30).dataset)
    builder = load_builder(staged)
    read = [image for split in builder.info.splits
            for image, _ in tfds.as_numpy(builder.as_dataset(split))]
    assert sorted(image.tobytes() for image in read) == sorted(landed)
    # the shards hold the landed bytes themselves: nothing was encoded again
    import tensorflow as tf

    shard_pngs = {tf.train.Example.FromString(record).features.feature["image"]
                  .bytes_list.value[0]
                  for split in builder.info.splits for shard in builder.shards[split]
                  for record in tf.data.TFRecordDataset(str(Path(staged.path) / shard))
                  .as_numpy_iterator()}
    assert shard_pngs == set(landed.values())


def test_duplicates_across_days_and_splits_are_counted_as_when_the_images_are_read(
        tmp_path, three_days):
    import io

    from PIL import Image

    uri, source = three_days
    copies = source / "dt=2026-12-01"
    for i in range(12):  # day 1's cats again: as landed, and encoded otherwise
        data = (source / f"dt={DAYS[0]}" / "cat" / f"{i}.png").read_bytes()
        (copies / "cat").mkdir(parents=True, exist_ok=True)
        (copies / "cat" / f"same-{i}.png").write_bytes(data)
        out = io.BytesIO()
        Image.open(io.BytesIO(data)).save(out, format="PNG", compress_level=0)
        (copies / "cat" / f"other-{i}.png").write_bytes(out.getvalue())
    land(source, uri, "dt=2026-12-01")
    staged = staging.stage(own(uri, tmp_path).dataset)
    builder = load_builder(staged)
    read = dataset_statistics(builder, split_names(builder, 0.1))["duplicates"]
    composed = manifest_of(staged)["statistics"][staging.statistics_key(0.1)]["duplicates"]
    assert composed == read
    assert read["within_split"] + read["count"] == 24  # every copy, once
    assert read["count"] > 0 and read["examples"]
