"""The tf.data input pipeline over a staged dataset: splits, stages, sharding.

``load_builder`` reads a staged dataset back (no preparation; a team's snapshot through
``snapshot_reader.py``), ``split_names`` gives the tfds split expressions for train,
validation and test, and ``make_dataset`` builds the ``as_supervised`` pipeline that
training and evaluation iterate, in these stages::

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
  written once by the stage step (``decoded_copy.py``), read as fixed-length records;
  "decode" is a reshape. The stages are the same, but a records' shuffle buffer now
  holds raw pixels (10,000 224x224 images: 1.5 GB; docs/datasets.md).
* **resize** is not a stage here: every staged dataset has one image shape (staging's
  statistics refuse a dataset that does not), and the team's own images are resized
  once, when their partition is staged (``partition_shards.py``), not every epoch.
* **cache**: ``dataset.input_cache``. ``auto`` keeps the decoded split in memory when
  its size (examples x image bytes, from the dataset's info) fits in a quarter of the
  memory available to this process (``MemAvailable``, or what the container's cgroup
  limit leaves when lower); otherwise every epoch reads and decodes again, in parallel.
* **augment**: ``dataset.augment``, training split only, after the shuffle: a
  per-example parallel map of stateless random ops (``flip``, ``crop``). Their seeds
  come from ``tf.data.Dataset.random(fit.seed)``, zipped with the examples and drawn
  anew each epoch, so a run is repeatable for a seed whatever the map's parallelism.
  Like the shuffle, a resumed run starts the stream again (docs/resume.md).

Sharding across workers is by data (``AutoShardPolicy.DATA``): every worker reads all
files and keeps every N-th element, which works whatever the number of shards.

This module decides for both Keras backends: in a process that runs Keras on JAX,
``load_builder`` reads the staged dataset without TensorFlow
(``staged_arrays.StagedArrays``: the same examples in the same order) and
``make_dataset`` serves it as NumPy batches (``array_input.SplitBatches``), with the
same cache rule, seeded shuffle and augmentations.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from training.data.catalog import get_builder
from training.data.memory import available_memory
from training.errors import DatasetError

log = logging.getLogger(__name__)


def load_builder(staged: Any) -> Any:
    """The builder reading a staged dataset back from its directory (no preparation, no
    registration: a team's own snapshot reads back like digits or mnist). ``staged`` is
    a ``staging.StagedDataset`` (not imported: staging computes statistics through
    here). Under ``tfds.testing.mock_data`` nothing was written, and the catalog's
    builder reads."""
    from training import backend

    if backend.imported() == "jax":  # no TensorFlow in this process
        from training.data.staged_arrays import StagedArrays

        return StagedArrays(staged)
    import tensorflow_datasets as tfds

    from training.data.snapshot_reader import SnapshotReader, is_snapshot

    if is_snapshot(staged.path):  # a team's data: its partitions' shards
        return SnapshotReader(staged.path)
    if (Path(staged.path) / "dataset_info.json").is_file():
        return tfds.builder_from_directory(staged.path)
    return get_builder(staged.name, staged.version, staged.staging_dir)


def split_names(builder: Any, validation_fraction: float) -> dict[str, str]:
    """tfds split expressions for train/validation/test.

    A dataset without a validation split gets one carved from the end of ``train``
    (whole percents, so ``validation_fraction`` is rounded to 1%).
    """
    splits = set(builder.info.splits.keys()) or {"train", "test"}
    if "train" not in splits or "test" not in splits:
        raise DatasetError(
            f"dataset {builder.name} needs 'train' and 'test' splits, has {sorted(splits)}"
        )
    if "validation" in splits:
        return {"train": "train", "validation": "validation", "test": "test"}
    pct = max(1, round(validation_fraction * 100))
    return {"train": f"train[:{100 - pct}%]", "validation": f"train[{100 - pct}%:]",
            "test": "test"}


def split_size(builder: Any, split: str) -> int | None:
    """The examples of ``split`` (a slice expression included), when the reader says."""
    if hasattr(builder, "num_examples"):  # staged_arrays.StagedArrays
        return builder.num_examples(split)
    try:
        return int(builder.info.splits[split].num_examples)
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


CACHE_SHARE = 4  # auto caches a split whose decoded size fits in 1/CACHE_SHARE of memory
LABEL_BYTES = 8  # an int64 class label beside each image


def make_dataset(
    builder: Any,
    split: str,
    *,
    global_batch_size: int,
    shuffle: bool,
    seed: int,
    shuffle_buffer: int = 10_000,
    cache: str = "auto",
    augment: str = "none",
    on_device: bool = False,
    decoded: bool = False,
) -> Any:
    """The ``as_supervised`` pipeline of one split, in the stages of the module doc.

    Images stay uint8: the model scales them (a Rescaling layer). A ``StagedArrays``
    (a JAX process's reader) gives a ``SplitBatches`` of the same stages or, with
    ``on_device`` (the training split) when the split fits there, its ``IndexBatches``
    (``device_split``). ``decoded`` (``dataset.decoded_copy``): the split's pixels are
    read from its decoded copy (``decoded_copy.py``), not decoded from the shards.
    """
    copy = decoded_split(builder, split) if decoded else None
    again = "read from its decoded copy every epoch" if copy else "decoded again every epoch"
    if not hasattr(builder, "as_dataset"):  # staged_arrays.StagedArrays
        from training.data.array_input import SplitBatches, processes

        if on_device:
            from training.data import device_split

            memory, what = device_split.device_memory()
            there, why = device_split.plan(
                decoded_bytes(builder, split), cache=cache, augment=augment,
                processes=processes()[1], memory=memory, what=what)
            log.info("input %s: %s (%s)", split, "kept on the device" if there else
                     "fed from the host", why)
            if there:
                arrays = (copy.images(), copy.labels) if copy else builder.arrays(split)
                return device_split.IndexBatches(
                    device_split.DeviceSplit(*arrays),
                    global_batch_size=global_batch_size, shuffle=shuffle, seed=seed)
        keep, why = cache_plan(cache, decoded_bytes(builder, split), available_memory(), again)
        log.info("input %s: %s (%s)", split, "cached in memory" if keep else "not cached",
                 why)
        return SplitBatches(builder, split, global_batch_size=global_batch_size,
                            shuffle=shuffle, seed=seed, keep_decoded=keep, decoded=copy,
                            augment=tuple(augment.split("_")) if augment != "none" else ())
    import numpy as np
    import tensorflow as tf

    ds, decode = copy.tf_records() if copy else undecoded(builder, split)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    ds = ds.with_options(options)
    keep, why = cache_plan(cache, decoded_bytes(builder, split), available_memory(), again)
    log.info("input %s: %s (%s)", split, "cached in memory" if keep else "not cached", why)
    if keep:
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).cache()
        # Fill the in-memory cache with one pass now. Keras starts each epoch's iterator
        # while the previous one may still be alive (prefetch threads); a second
        # iterator over a half-filled cache reads only what is cached (seen: a
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


def undecoded(builder: Any, split: str) -> tuple[Any, Any]:
    """A split's ``(encoded image, label)`` pairs, read in parallel and in order, and
    the function that decodes one pair."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    if hasattr(builder, "undecoded"):  # a team's snapshot (snapshot_reader.py)
        return builder.undecoded(split), builder.decode
    # tfds would also cache a small split on its own (try_autocache): the decision is
    # input_cache's, so that ``none`` reads again and nothing is held twice.
    read_config = tfds.ReadConfig(num_parallel_calls_for_interleave_files=tf.data.AUTOTUNE,
                                  num_parallel_calls_for_decode=tf.data.AUTOTUNE,
                                  try_autocache=False)
    image_key = (builder.info.supervised_keys or ("image",))[0]
    feature = builder.info.features[image_key]
    ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False,
                            read_config=read_config,
                            decoders={image_key: tfds.decode.SkipDecoding()})

    def decode(image: Any, label: Any) -> Any:
        return feature.decode_example(image), label

    return ds, decode


def decoded_split(builder: Any, split: str) -> Any:
    """``split``'s decoded copy, for a run with ``dataset.decoded_copy``."""
    from training.data import decoded_copy

    path = getattr(builder, "path", None) or getattr(builder, "data_dir", None)
    return decoded_copy.required(Path(path) if path else None, split, builder.name)


def decoded_bytes(builder: Any, split: str) -> int | None:
    """The split's size once decoded (examples x image bytes + labels), from the
    dataset's info; None when the info does not say (no split sizes, or images of
    unknown shape)."""
    import numpy as np

    if hasattr(builder, "num_examples"):  # staged_arrays.StagedArrays
        shape = builder.info.image_shape
        return builder.num_examples(split) * (int(np.prod(shape)) + LABEL_BYTES)
    info = builder.info
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


def cache_plan(mode: str, size: int | None, available: int | None,
               again: str = "decoded again every epoch") -> tuple[bool, str]:
    """Whether to cache the decoded split in memory, and why (logged); ``again``: what
    happens every epoch when it is not (with a decoded copy: read from it)."""
    if mode == "memory":
        return True, "dataset.input_cache is 'memory'"
    if mode == "none":
        return False, f"dataset.input_cache is 'none': {again}"
    if size is None:
        return True, "dataset.input_cache 'auto': the dataset's info gives no size, cached"
    if available is None:
        return True, f"dataset.input_cache 'auto': {_mb(size)} decoded, memory unknown"
    budget = available // CACHE_SHARE
    fits = size <= budget
    return fits, (f"dataset.input_cache 'auto': {_mb(size)} decoded "
                  f"{'fits in' if fits else 'exceeds'} {_mb(budget)}, a quarter of the "
                  f"{_mb(available)} available" + ("" if fits else f": {again}"))


def _mb(size: int) -> str:
    return f"{size / 2**20:,.1f} MB"


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
