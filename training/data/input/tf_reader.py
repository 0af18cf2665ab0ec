"""The tf.data reader: a staged split as a tf.data pipeline, in a TensorFlow process.

``choose.py`` gives a TensorFlow process's builder (tfds's, or a team's
``snapshot/snapshot_reader.SnapshotReader``) to this reader: ``TfReader`` for a tfds
builder, ``SnapshotTfReader`` for a snapshot, which differ only in how a split's
encoded records are read (``undecoded``). ``dataset`` builds the ``as_supervised``
pipeline that training and evaluation iterate, in these stages::

    cached:     read shards -> decode -> cache in memory -> [shuffle] -> [augment]
    not cached: read shards -> [shuffle encoded records] -> decode -> [augment]
                -> batch -> prefetch

* **read**: the shard files are read in parallel and in order (``deterministic``), the
  images still encoded (``undecoded``), so a seed gives one order.
* **decode**: a parallel map (PNG for the team's own images, whatever the dataset
  stored). Not cached, it comes after the shuffle: the shuffle buffer holds small
  encoded records, and decoding and augmenting overlap the reading from the first
  batch on, whatever the split's size (before, a buffer as large as the split held
  every decoded image of the epoch before the first batch came out).
* **decoded copy** (``dataset.decoded_copy``): the records are the split's raw pixels,
  written once by the stage step (``decoded_copy.py``), read as fixed-length records
  (``copy_records``);
  "decode" is a reshape. The stages are the same, but a records' shuffle buffer now
  holds raw pixels (10,000 224x224 images: 1.5 GB; docs/datasets.md).
* **resize** is not a stage here: every staged dataset has one image shape (staging's
  statistics refuse a dataset that does not), and the team's own images are resized
  once, when their partition is staged (``snapshot/partition_shards.py``), not every
  epoch.
* **cache**: ``dataset.input_cache`` (``memory.cache_plan``). ``auto`` keeps the
  decoded split in memory when its size (examples x image bytes, from the dataset's
  info) fits in a quarter of the memory available to this process (``MemAvailable``,
  or what the container's cgroup limit leaves when lower); otherwise every epoch reads
  and decodes again, in parallel.
* **augment**: ``dataset.augment``, training split only, after the shuffle: a
  per-example parallel map of stateless random ops (``flip``, ``crop``). Their seeds
  come from ``tf.data.Dataset.random(fit.seed)``, zipped with the examples and drawn
  anew each epoch, so a run is repeatable for a seed whatever the map's parallelism.
  Like the shuffle, a resumed run starts the stream again (docs/resume.md).

Sharding across workers is by data (``AutoShardPolicy.DATA``): every worker reads all
files and keeps every N-th element, which works whatever the number of shards.

A process that runs Keras on JAX reads the same examples in the same order without
TensorFlow, with the same cache rule, seeded shuffle and augmentations
(``numpy_reader.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from training.data.input.memory import LABEL_BYTES, available_memory, cache_plan
from training.errors import DatasetError

log = logging.getLogger(__name__)


class TfReader:
    """A tfds builder's splits as tf.data pipelines (``choose.Reader``)."""

    def __init__(self, builder: Any) -> None:
        self.builder, self.name = builder, builder.name

    def directory(self) -> Path | None:
        """Where the staged dataset is (its decoded copy beside its shards)."""
        return Path(self.builder.data_dir) if self.builder.data_dir else None

    def size(self, split: str) -> int | None:
        """The examples of ``split`` (a slice expression included), when the info says."""
        try:
            return int(self.builder.info.splits[split].num_examples)
        except (KeyError, ValueError, TypeError, AttributeError):
            return None

    def decoded_bytes(self, split: str) -> int | None:
        """The split's size once decoded (examples x image bytes + labels), from the
        dataset's info; None when the info does not say (no split sizes, or images of
        unknown shape)."""
        import numpy as np

        info = self.builder.info
        try:
            examples = info.splits[split].num_examples
            image = info.features[info.supervised_keys[0]]
            shape = tuple(image.shape)
            itemsize = np.dtype(image.np_dtype).itemsize
        except (KeyError, ValueError, TypeError, AttributeError, IndexError):
            return None
        if not examples or any(d is None for d in shape):
            return None
        return int(examples) * (int(np.prod(shape)) * itemsize + LABEL_BYTES)

    def model_info(self) -> dict[str, Any]:
        """The model's input shape and classes (``sources/catalog.dataset_info``)."""
        from training.data.sources.catalog import dataset_info

        return dataset_info(self.builder)

    def image_shape(self) -> tuple[int, ...]:
        info = self.builder.info
        return tuple(info.features[(info.supervised_keys or ("image",))[0]].shape)

    def label_names(self) -> list[str]:
        from training.data.snapshot.statistics import label_names

        return label_names(self.builder)

    def kept_on_device(self, dataset: Any) -> None:
        """A tf.data pipeline feeds the devices from the host."""
        return None

    def undecoded(self, split: str) -> tuple[Any, Any]:
        """A split's ``(encoded image, label)`` pairs, read in parallel and in order, and
        the function that decodes one pair."""
        import tensorflow as tf
        import tensorflow_datasets as tfds

        # tfds would also cache a small split on its own (try_autocache): the decision is
        # input_cache's, so that ``none`` reads again and nothing is held twice.
        read_config = tfds.ReadConfig(num_parallel_calls_for_interleave_files=tf.data.AUTOTUNE,
                                      num_parallel_calls_for_decode=tf.data.AUTOTUNE,
                                      try_autocache=False)
        builder = self.builder
        image_key = (builder.info.supervised_keys or ("image",))[0]
        feature = builder.info.features[image_key]
        ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False,
                                read_config=read_config,
                                decoders={image_key: tfds.decode.SkipDecoding()})

        def decode(image: Any, label: Any) -> Any:
            return feature.decode_example(image), label

        return ds, decode

    def dataset(self, split: str, *, global_batch_size: int, shuffle: bool, seed: int,
                shuffle_buffer: int = 10_000, cache: str = "auto", augment: str = "none",
                on_device: bool = False, decoded: bool = False) -> Any:
        """The ``as_supervised`` pipeline of one split, in the stages of the module doc.

        Images stay uint8: the model scales them (a Rescaling layer). ``decoded``
        (``dataset.decoded_copy``): the split's pixels are read from its decoded copy
        (``decoded_copy.py``), not decoded from the shards. ``on_device`` is a JAX
        process's (``numpy_reader``): a tf.data pipeline is fed from the host.
        """
        import numpy as np
        import tensorflow as tf

        copy = None
        if decoded:
            from training.data.input import decoded_copy

            copy = decoded_copy.required(self.directory(), split, self.name)
        again = ("read from its decoded copy every epoch" if copy
                 else "decoded again every epoch")
        ds, decode = copy_records(copy) if copy else self.undecoded(split)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        options.deterministic = True
        ds = ds.with_options(options)
        keep, why = cache_plan(cache, self.decoded_bytes(split), available_memory(), again)
        log.info("input %s: %s (%s)", split, "cached in memory" if keep else "not cached",
                 why)
        if keep:
            ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).cache()
            # Fill the in-memory cache with one pass now. Keras starts each epoch's
            # iterator while the previous one may still be alive (prefetch threads); a
            # second iterator over a half-filled cache reads only what is cached (seen: a
            # validation pass over 89 of 180 examples). A complete cache is the same for
            # every iterator.
            ds.reduce(np.int64(0), lambda count, _: count + 1)
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if not keep:  # after the shuffle, which holds encoded records: decode overlaps it
            ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if augment != "none":  # flip, crop, flip_crop
            ds = augmented(ds, tuple(augment.split("_")), seed)
        return ds.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)


class SnapshotTfReader(TfReader):
    """A team's snapshot (``snapshot/snapshot_reader.SnapshotReader``): its records read
    by the snapshot's own reader, decoded by its ``decode``."""

    def directory(self) -> Path | None:
        return Path(self.builder.path)

    def undecoded(self, split: str) -> tuple[Any, Any]:
        return self.builder.undecoded(split), self.builder.decode


def copy_records(copy: Any) -> tuple[Any, Any]:
    """A split's decoded copy (``decoded_copy.DecodedSplit``) as ``undecoded``'s pair:
    the fixed-size records of raw pixels zipped with the labels, in order, and the
    function that turns a record into an image."""
    import tensorflow as tf

    pixels = tf.data.FixedLengthRecordDataset(str(copy.pixels), copy.image_bytes,
                                              buffer_size=1 << 22)
    records = tf.data.Dataset.zip((pixels, tf.data.Dataset.from_tensor_slices(copy.labels)))
    # A file's records are not counted by tf.data; Keras needs the epoch's length.
    records = records.apply(tf.data.experimental.assert_cardinality(copy.count))
    shape = copy.shape

    def decode(record: Any, label: Any) -> Any:
        return tf.reshape(tf.io.decode_raw(record, tf.uint8), shape), label

    return records, decode


def augmented(ds: Any, ops: tuple[str, ...], seed: int) -> Any:
    """``ds`` with each image randomly changed by ``ops`` (``flip``, ``crop``) in a
    parallel, order-keeping map. Every example gets its own draw from
    ``Dataset.random(seed)`` (anew for each epoch's iterator), the seed of its ops."""
    import tensorflow as tf

    draws = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)

    def change(example: Any, draw: Any) -> Any:
        image, label = example
        shape = image.shape
        if shape.rank != 3 or not shape.is_fully_defined():
            raise DatasetError(f"dataset.augment {'_'.join(ops)!r} needs images of one "
                               f"shape (height, width, channels), got {shape}; or set "
                               "dataset.augment to 'none'")
        flip_seed, crop_seed = tf.stack([draw, 0]), tf.stack([draw, 1])  # one per op
        if "flip" in ops:
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        if "crop" in ops:
            pad_h, pad_w = _crop_pad(shape[0]), _crop_pad(shape[1])
            padded = tf.pad(image, [[pad_h, pad_h], [pad_w, pad_w], [0, 0]], mode="REFLECT")
            image = tf.image.stateless_random_crop(padded, size=list(shape), seed=crop_seed)
        return tf.ensure_shape(image, shape), label

    return tf.data.Dataset.zip((ds, draws)).map(
        change, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _crop_pad(side: int) -> int:
    """The reflected padding a crop moves within: 1/8 of the side, at least 1 pixel,
    none for a side of 1 (nothing to reflect)."""
    return 0 if side < 2 else max(1, side // 8)
