"""The tf.data input pipeline over a staged dataset: splits, batches, sharding.

``load_builder`` reads a staged dataset back (no preparation), ``split_names`` gives
the tfds split expressions for train, validation and test, and ``make_dataset`` builds
the ``as_supervised`` pipeline that training and evaluation iterate.

Sharding across workers is by data (``AutoShardPolicy.DATA``): every worker reads all
files and keeps every N-th element, which works whatever the number of shards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.data.catalog import get_builder
from training.errors import DatasetError


def load_builder(staged: Any) -> Any:
    """The builder reading a staged dataset back from its directory (no preparation, no
    registration: a team's own snapshot reads back like digits or mnist). ``staged`` is
    a ``staging.StagedDataset`` (not imported: staging computes statistics through
    here). Under ``tfds.testing.mock_data`` nothing was written, and the catalog's
    builder reads."""
    import tensorflow_datasets as tfds

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


def make_dataset(
    builder: Any,
    split: str,
    *,
    global_batch_size: int,
    shuffle: bool,
    seed: int,
    shuffle_buffer: int = 10_000,
) -> Any:
    """``as_supervised`` tf.data pipeline: cache, seeded shuffle, batch, prefetch.

    Images stay uint8: the model scales them (a Rescaling layer).
    """
    import numpy as np
    import tensorflow as tf

    ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    ds = ds.with_options(options).cache()
    # Fill the in-memory cache with one pass now. Keras starts each epoch's iterator
    # while the previous one may still be alive (prefetch threads); a second iterator
    # over a half-filled cache reads only what is cached (seen: a validation pass over
    # 89 of 180 examples). A complete cache is the same for every iterator.
    ds.reduce(np.int64(0), lambda count, _: count + 1)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)
