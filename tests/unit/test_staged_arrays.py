"""A staged dataset read without TensorFlow (``training.data.input.records``, ``read_order``,
``staged_arrays``): the very examples, labels and order of the tf.data reader
(``input.load_builder`` + ``undecoded``) for the staged digits, a tfds builder of many
shards and a team's snapshot, and no ``tensorflow`` import on the way."""

from __future__ import annotations

import io
import json
import os
import random
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from training.config import RunConfig
from training.data.input import read_order
from training.data.input.choose import undecoded
from training.data.input.records import iter_records, parse_example
from training.data.input.staged_arrays import StagedArrays, decode_images
from training.data.snapshot import staging
from training.data.snapshot.snapshot_reader import SnapshotReader, is_snapshot
from training.data.snapshot.splits import split_names
from training.errors import DatasetError
from training.registry import open_store

ROOT = Path(__file__).resolve().parents[2]
SLICES = ("train[:90%]", "train[90%:]", "train[33%:41%]")


def tf_reader(staged):
    """The tf.data reader ``input.load_builder`` gives a TensorFlow process (built here,
    whatever this process's Keras backend): a team's snapshot's ``SnapshotReader``, else
    tfds's builder of the prepared directory."""
    if is_snapshot(staged.path):
        return SnapshotReader(staged.path)
    return tfds.builder_from_directory(staged.path)


def reference(builder, split):
    """What the tf.data reader yields: encoded images, decoded images, labels."""
    ds, decode = undecoded(builder, split)
    pairs = list(tfds.as_numpy(ds))
    decoded = [image for image, _ in tfds.as_numpy(ds.map(decode))]
    return ([bytes(image) for image, _ in pairs], np.stack(decoded),
            np.array([label for _, label in pairs], dtype=np.int64))


def assert_reads_like_tf_data(staged, splits):
    builder, arrays = tf_reader(staged), StagedArrays(staged)
    for split in splits:
        encoded, images, labels = reference(builder, split)
        got_encoded, got_labels = arrays.encoded(split)
        assert got_encoded == encoded, split  # the same records, in the same order
        got_images, again = arrays.arrays(split)
        assert got_images.dtype == np.uint8 and got_labels.dtype == np.int64
        assert np.array_equal(got_images, images), split
        assert np.array_equal(got_labels, labels) and np.array_equal(again, labels), split
        assert arrays.num_examples(split) == len(labels)


# --- a tfds builder of many shards, prepared offline -------------------------------------


def tiny_builder(data_dir: Path, *, channels=1, encoding="png", shards=20, train=700,
                 disable_shuffling=False):
    class Tiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, supervised_keys=("picture", "kind"),
                disable_shuffling=disable_shuffling,
                features=tfds.features.FeaturesDict({
                    "picture": tfds.features.Image(shape=(6, 5, channels),
                                                   encoding_format=encoding),
                    "kind": tfds.features.ClassLabel(names=["ant", "bee", "cat"])}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(train, 0),
                    "test": self._generate_examples(train // 3, 1)}

        def _generate_examples(self, count, seed):
            rng = np.random.default_rng(seed)
            for i in range(count):
                yield i, {"picture": rng.integers(0, 256, (6, 5, channels), dtype=np.uint8),
                          "kind": int(rng.integers(0, 3))}

    tfds.disable_progress_bar()
    builder = Tiny(data_dir=os.fspath(data_dir))
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=shards))
    return staging.StagedDataset(name="tiny", version="1.0.0", path=builder.data_dir,
                                 staging_dir=os.fspath(data_dir), fingerprint="unstaged")


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    """20 shards of 35 examples: more shards than tfds's cycle (16), more examples in
    each than its block (16)."""
    return tiny_builder(tmp_path_factory.mktemp("tiny-many"))


@pytest.fixture(scope="module")
def ordered_rgb(tmp_path_factory):
    """A dataset that disables shuffling (read one shard after the other), RGB."""
    return tiny_builder(tmp_path_factory.mktemp("tiny-ordered"), channels=3, shards=7,
                        train=300, disable_shuffling=True)


# --- a team's snapshot of three days ------------------------------------------------------


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """Three days of different sizes (so the shards run out at different turns), RGB at
    a shape that is not square, labels that sort in another order than they land."""
    tmp = tmp_path_factory.mktemp("snapshot")
    store = open_store(os.fspath(tmp / "incoming"))
    days = {"2026-11-28": 9, "2026-11-29": 4, "2026-11-30": 14}
    for day, per_label in days.items():
        for label in ("zebra", "cat", "dog"):
            for i in range(per_label):
                rng = np.random.default_rng(zlib.crc32(f"{day}/{label}/{i}".encode()))
                out = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(
                    out, format="PNG")
                store.put_bytes(f"dt={day}/{label}/{i}.png", out.getvalue())
        store.put_bytes(f"dt={day}/_SUCCESS", b"{}")
    cfg = RunConfig.from_flat({
        "dataset": "pets", "data_source": "images", "data_uri": os.fspath(tmp / "incoming"),
        "image_shape": "7x9x3", "staging_dir": os.fspath(tmp / "staging"),
        "store_uri": os.fspath(tmp / "store"), "data_until": "2026-11-30"})
    return staging.stage(cfg.dataset)


# --- the same examples, labels and order as tf.data --------------------------------------


def test_staged_digits_read_like_tf_data(staged_digits):
    assert_reads_like_tf_data(staged_digits, ("train", "validation", "test", *SLICES))


def test_a_tfds_dataset_of_many_shards_reads_in_tfds_interleave_order(many_shards):
    builder = tf_reader(many_shards)
    assert builder.info.splits["train"].num_shards == 20
    assert min(builder.info.splits["train"].shard_lengths) > read_order.TFDS_BLOCK_LENGTH
    assert_reads_like_tf_data(many_shards, ("train", "test", *SLICES))


def test_a_dataset_that_disables_shuffling_reads_its_shards_in_turn(ordered_rgb):
    assert_reads_like_tf_data(ordered_rgb, ("train", "test", "train[90%:]"))


def test_a_teams_snapshot_reads_like_the_snapshot_reader(snapshot):
    manifest = json.loads((Path(snapshot.path) / "staging-manifest.json").read_text())
    assert len(manifest["shards"]["train"]) == 3
    assert_reads_like_tf_data(snapshot, [s for s in ("train", "validation", "test", *SLICES)
                                         if s.split("[")[0] in manifest["shards"]])


def test_the_info_is_the_tfds_builders(staged_digits, many_shards, snapshot):
    for staged in (staged_digits, many_shards, snapshot):
        builder, info = tf_reader(staged), StagedArrays(staged).info
        image_key, label_key = builder.info.supervised_keys
        assert info.image_shape == tuple(builder.info.features[image_key].shape)
        assert info.num_classes == builder.info.features[label_key].num_classes
        assert info.splits == {s: builder.info.splits[s].num_examples
                               for s in builder.info.splits}
        for fraction in (0.1, 0.25):
            assert split_names(StagedArrays(staged), fraction) == split_names(builder, fraction)
    assert StagedArrays(many_shards).info.label_names == ("ant", "bee", "cat")
    assert StagedArrays(snapshot).info.label_names == ("cat", "dog", "zebra")
    assert StagedArrays(staged_digits).info.dataset_info() == {"input_shape": (8, 8, 1),
                                                               "num_classes": 10}


def test_reading_uses_no_tensorflow(staged_digits, snapshot):
    code = (
        "import sys\n"
        "from training.data.snapshot.splits import split_names\n"
        "from training.data.input.staged_arrays import StagedArrays\n"
        "from training.data.snapshot.staging import StagedDataset\n"
        "for path in sys.argv[1:]:\n"
        "    arrays = StagedArrays(StagedDataset(name='x', version='1', path=path,\n"
        "                                        staging_dir='', fingerprint=''))\n"
        "    images, labels = arrays.arrays(split_names(arrays, 0.1)['train'])\n"
        "    assert len(images) == len(labels) > 0 and images.dtype.name == 'uint8'\n"
        "    assert len(arrays.decode(arrays.encoded('train[90%:]')[0])) > 0\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'tensorflow_datasets', 'keras', 'jax')]\n"
        "print(loaded)\n")
    done = subprocess.run([sys.executable, "-c", code, staged_digits.path, snapshot.path],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# --- the order's rules against tf.data and the installed tfds -----------------------------


def test_the_interleave_is_tf_datas():
    rng = random.Random(7)
    for _ in range(40):
        lengths = [rng.choice([0, 1, 15, 16, 17, 33]) for _ in range(rng.choice([1, 3, 18]))]
        cycle, block = rng.choice([1, 2, 16, len(lengths)]), rng.choice([1, 3, 16])
        starts = np.cumsum([0, *lengths])[:-1].tolist()
        expected = list(read_order.interleave(
            (range(s, s + n) for s, n in zip(starts, lengths, strict=True)), cycle, block))
        files = tf.data.Dataset.from_tensor_slices((tf.constant(starts, tf.int64),
                                                    tf.constant(lengths, tf.int64)))
        for parallel in (None, tf.data.AUTOTUNE):
            got = files.interleave(lambda s, n: tf.data.Dataset.range(s, s + n),
                                   cycle_length=cycle, block_length=block,
                                   num_parallel_calls=parallel,
                                   deterministic=True if parallel else None)
            assert [int(x) for x in got] == expected, (lengths, cycle, block, parallel)


def test_the_order_constants_are_the_installed_tfds_defaults():
    from tensorflow_datasets.core import reader

    assert tfds.ReadConfig().interleave_block_length == read_order.TFDS_BLOCK_LENGTH
    assert reader._get_default_interleave_cycle_length(
        disable_shuffling=False) == read_order.TFDS_CYCLE_LENGTH
    assert reader._get_default_interleave_cycle_length(
        disable_shuffling=True) == read_order.TFDS_ORDERED_CYCLE_LENGTH


def test_shard_reads_are_tfds_file_instructions():
    from tensorflow_datasets.core.utils.shard_utils import get_file_instructions

    lengths = [5, 0, 7, 3, 9]
    for start in range(0, 24, 3):
        for end in range(start + 1, 25, 4):
            tfds_reads = [(int(f.filename), f.skip, f.take if f.take != -1 else
                           lengths[int(f.filename)] - f.skip)
                          for f in get_file_instructions(start, end, range(5), lengths)]
            assert read_order.tfds_shard_reads(lengths, start, end) == tfds_reads


def test_a_split_expression_is_a_split_or_a_whole_percent_slice():
    sizes = {"train": 1258, "test": 359}
    assert read_order.parse_split("train[:90%]", sizes, "d").end == round(1258 * 0.9)
    assert read_order.parse_split("train[90%:]", sizes, "d").start == 1132
    assert read_order.parse_split("test", sizes, "d").count == 359
    for bad in ("validation", "train[:90]", "train[:150%]", "train[-10%:]"):
        with pytest.raises(DatasetError, match=r"dataset d: |dataset d has no split"):
            read_order.parse_split(bad, sizes, "dataset d")


# --- records and Example protocol buffers -------------------------------------------------


def example(**features) -> tf.train.Example:
    def feature(values):
        if values and isinstance(values[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if values and isinstance(values[0], float):
            return tf.train.Feature(float_list=tf.train.FloatList(value=values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    return tf.train.Example(features=tf.train.Features(
        feature={k: feature(v) for k, v in features.items()}))


def as_python(message: tf.train.Example) -> dict:
    out = {}
    for key, feature in message.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out


def test_records_and_examples_read_as_tensorflow_reads_them(tmp_path):
    examples = [
        example(image=[b"\x89PNG\x00" * 40], label=[7]),
        example(many=[b"", b"a" * 300, b"\xff"], ints=[0, -1, 2**63 - 1, -(2**63), 300],
                floats=[0.5, -1.25, 3.4e38, 1e-30], empty=[]),
        example(),
        example(**{"ключ/name": [1.0]}, big=[b"x" * 70_000]),
    ]
    path = tmp_path / "mixed.tfrecord"
    with tf.io.TFRecordWriter(os.fspath(path)) as writer:
        for message in examples:
            writer.write(message.SerializeToString())
    records = list(iter_records(path))
    assert records == [r.numpy() for r in tf.data.TFRecordDataset(os.fspath(path))]
    for record, message in zip(records, examples, strict=True):
        assert parse_example(record) == as_python(message)  # float32s widened alike
    spec = {"image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    parsed = tf.io.parse_single_example(records[0], spec)
    assert parse_example(records[0]) == {"image": [parsed["image"].numpy()],
                                         "label": [int(parsed["label"])]}
    (tmp_path / "empty").touch()
    assert list(iter_records(tmp_path / "empty")) == []


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    if wire == 2:
        payload = _varint(len(payload)) + payload
    return _varint(number << 3 | wire) + payload


def test_unpacked_lists_and_unknown_fields_read_as_protobuf_reads_them():
    ints = b"".join(_field(1, 0, _varint(v)) for v in (5, -3, 2**40))
    floats = b"".join(_field(1, 5, struct.pack("<f", v)) for v in (1.5, -2.0))
    feature = {"i": _field(3, 2, ints), "f": _field(2, 2, floats),
               "b": _field(1, 2, _field(1, 2, b"abc") + _field(9, 0, _varint(1)))}
    entries = b"".join(_field(1, 2, _field(1, 2, k.encode()) + _field(2, 2, v))
                       for k, v in feature.items())
    raw = _field(1, 2, entries) + _field(15, 1, b"\x00" * 8)  # an unknown fixed64 field
    assert parse_example(raw) == as_python(tf.train.Example.FromString(raw)) == {
        "i": [5, -3, 2**40], "f": [1.5, -2.0], "b": [b"abc"]}


def test_a_broken_record_file_or_example_names_the_file(tmp_path):
    path = tmp_path / "cut.tfrecord"
    with tf.io.TFRecordWriter(os.fspath(path)) as writer:
        writer.write(example(label=[1]).SerializeToString())
        writer.write(example(label=[2]).SerializeToString())
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(DatasetError, match=rf"TFRecord file {path} is truncated: the "
                                           r"record at byte \d+ needs \d+ bytes"):
        list(iter_records(path))
    with pytest.raises(DatasetError, match="not a tf.train.Example"):
        parse_example(b"\x0a\x05\x0a\x03")


# --- decoding, and what cannot be read ----------------------------------------------------


def _jpeg(pixels: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels).save(
        out, format="JPEG", quality=90, **options)
    return out.getvalue()


def test_jpeg_decodes_as_tensorflow_decodes_it_where_no_chroma_is_subsampled():
    rng = np.random.default_rng(3)
    gray = rng.integers(0, 256, (40, 12, 10, 1), dtype=np.uint8)
    color = rng.integers(0, 256, (40, 12, 10, 3), dtype=np.uint8)
    for pixels, options in ((gray, {}), (color, {"subsampling": 0})):
        encoded = [_jpeg(p, **options) for p in pixels]
        expected = np.stack([tf.io.decode_image(b, channels=pixels.shape[-1]).numpy()
                             for b in encoded])
        assert np.array_equal(decode_images(encoded, pixels.shape[1:], workers=4), expected)
    # tfds's color JPEG (tf.io.encode_jpeg: 4:2:0 chroma): TensorFlow's accurate IDCT,
    # not its default fast one (the module doc: a few levels apart)
    encoded = [tf.io.encode_jpeg(p).numpy() for p in color]
    accurate = np.stack([tf.io.decode_jpeg(b, channels=3, dct_method="INTEGER_ACCURATE")
                         .numpy() for b in encoded])
    fast = np.stack([tf.io.decode_image(b, channels=3).numpy() for b in encoded])
    decoded = decode_images(encoded, color.shape[1:])
    assert np.array_equal(decoded, accurate)
    assert 0 < np.abs(decoded.astype(int) - fast).max() <= 16


def test_decoding_names_the_image_it_cannot_decode():
    rng = np.random.default_rng(0)
    good = _jpeg(rng.integers(0, 256, (4, 5, 1), dtype=np.uint8))
    other = _jpeg(rng.integers(0, 256, (4, 4, 1), dtype=np.uint8))
    with pytest.raises(DatasetError, match=r"split x: image 300 is 4x4 pixels, the "
                                           r"dataset's images are 5x4"):
        decode_images([good] * 300 + [other] + [good] * 99, (4, 5, 1), what="split x")
    with pytest.raises(DatasetError, match=r"images: image 1 cannot be decoded .*PNG or JPEG"):
        decode_images([good, b"GIF89a not an image"], (4, 5, 1))
    assert decode_images([], (4, 5, 1)).shape == (0, 4, 5, 1)


def test_a_dataset_stored_in_another_file_format_is_refused(staged_digits, tmp_path):
    copy = tmp_path / "digits"
    copy.mkdir()
    info = json.loads((Path(staged_digits.path) / "dataset_info.json").read_text())
    (copy / "dataset_info.json").write_text(json.dumps({**info, "fileFormat": "array_record"}))
    with pytest.raises(DatasetError, match=r"dataset_info.json: fileFormat is "
                                           r"'array_record'; only 'tfrecord'"):
        StagedArrays(copy)
    with pytest.raises(DatasetError, match="neither a snapshot's staging-manifest.json"):
        StagedArrays(tmp_path)
    with pytest.raises(DatasetError, match=r"has no split 'train\[:90\]'"):
        StagedArrays(staged_digits).encoded("train[:90]")
