"""The data sections of a run's configuration: which dataset (a catalog name or a
team's own dated partitions) and the checks it must pass before training."""

from __future__ import annotations

from dataclasses import dataclass

from training.config.schema import Section, setting


@dataclass(frozen=True)
class DatasetConfig(Section):
    SECTION = "dataset"

    name: str = setting(
        "digits",
        "Dataset to train on: 'digits' (built in, offline) or a tensorflow-datasets "
        "image-classification dataset such as mnist, fashion_mnist or cifar10; with "
        "data_source images or tfrecord, the name the team's data is staged under.",
        key="dataset",
        pattern=r"^[a-z][a-z0-9_]*(/[a-z0-9_]+)?$",
        says="a dataset name: lower-case letters, digits and '_', starting with a letter, "
             "with an optional '/config' (e.g. mnist, cifar10)",
    )
    version: str | None = setting(
        None,
        "Dataset version (e.g. 3.0.1); empty for the builder's default version.",
        key="dataset_version",
        nullable=True,
        pattern=r"^\d+\.\d+\.\d+$",
        says="a version of three numbers, like 3.0.1",
    )
    source: str = setting(
        "catalog",
        "Where the data comes from: catalog (the dataset name above), images (labelled "
        "image files under data_uri as dt=YYYY-MM-DD/<label>/<file>) or tfrecord "
        "(TFRecord files of tf.train.Example with 'image' bytes and a 'label' under "
        "data_uri as dt=YYYY-MM-DD/<file>).",
        key="data_source", enum=["catalog", "images", "tfrecord"],
    )
    uri: str = setting(
        "", "The team's data for data_source images or tfrecord: a directory or "
        "s3://bucket/prefix holding dt=YYYY-MM-DD partitions, each complete once its "
        "_SUCCESS marker is written.", key="data_uri",
        pattern=r"^$|^(s3://[a-z0-9.-]{3,63}(/.*)?|file://.+|[^:]+)$",
        says="empty, or s3://bucket/prefix, file:///path or a local path",
    )
    image_shape: str = setting(
        "", "Height x width x channels every image of the team's data is resized to "
        "(e.g. 28x28x1).", key="image_shape",
        pattern=r"^$|^[1-9][0-9]{0,3}x[1-9][0-9]{0,3}x[134]$",
        says="empty, or height x width x channels like 28x28x1 (channels 1, 3 or 4)",
    )
    until: str | None = setting(
        None, "Last partition date staged (included), YYYY-MM-DD; empty: the latest "
        "partition the triggering labelled_data events landed, else the last day that is "
        "over when the Airflow run's data interval ends (for a nightly run, yesterday), "
        "or every partition from the CLI.", key="data_until",
        nullable=True, pattern=r"^\d{4}-\d{2}-\d{2}$", says="a date like 2026-12-01",
    )
    window_days: int = setting(
        0, "Stage only the partitions of the last N days up to data_until (0: all of "
        "them).", key="window_days", minimum=0, maximum=3650,
    )
    test_percent: int = setting(
        20, "Percent of the team's images in the test split, chosen by a hash of each "
        "image's bytes: an image never moves between splits from night to night.",
        key="test_percent", minimum=1, maximum=50,
    )
    validation_percent: int = setting(
        10, "Percent of the team's images in the validation split (chosen like the test "
        "split).", key="validation_percent", minimum=1, maximum=50,
    )
    staging_dir: str = setting(
        "var/datasets", "Directory where datasets are prepared and cached.",
        key="staging_dir", deployment=True,
    )
    validation_fraction: float = setting(
        0.1,
        "Share of the training split held out for validation when the dataset has no "
        "validation split of its own.",
        key="validation_fraction",
        exclusive_minimum=0.0,
        maximum=0.5,
    )
    shuffle_buffer: int = setting(
        10_000, "Examples in the tf.data shuffle buffer.", key="shuffle_buffer",
        minimum=1, maximum=1_000_000,
    )
    input_cache: str = setting(
        "auto", "Keep the decoded images in memory after the first epoch: memory, none "
        "(decode again every epoch), or auto (memory when the split's decoded size fits "
        "in a quarter of the memory available).", key="input_cache",
        enum=["auto", "memory", "none"],
    )
    decoded_copy: bool = setting(
        False, "Also keep each split decoded on disk (raw uint8 pixels, written once when "
        "the dataset is staged) and train and evaluate from it instead of decoding images "
        "every epoch: for images slow to decode (224x224 and up) in a split that does not "
        "fit in memory. Costs height x width x channels bytes of disk an image.",
        key="decoded_copy",
    )
    augment: str = setting(
        "none", "Random changes to each training image in the tf.data pipeline (parallel, "
        "on the CPU, seeded by fit.seed): flip (left-right), crop (pad by 1/8 of each "
        "side, at least 1 pixel, crop back at a random place), flip_crop (both), none.",
        key="augment",
        enum=["none", "flip", "crop", "flip_crop"],
    )


@dataclass(frozen=True)
class ValidationConfig(Section):
    SECTION = "validation"

    min_examples_per_class: int = setting(
        5, "Fewest training examples a class may have.", key="min_examples_per_class",
        minimum=0, maximum=1_000_000,
    )
    max_corrupt_fraction: float = setting(
        0.01, "Largest share of the team's image files that may be undecodable (they are "
        "left out and listed).", key="max_corrupt_fraction", minimum=0.0, maximum=1.0,
    )
    drift_threshold: float = setting(
        0.3, "Largest drift from production's training data allowed, for the label "
        "distribution (Jensen-Shannon distance) and the pixel means (shift in standard "
        "deviations / 2), each between 0 and 1.", key="drift_threshold",
        exclusive_minimum=0.0, maximum=1.0,
    )
    force_train: bool = setting(
        False, "Train even when the staged data is the snapshot production was trained "
        "on (otherwise the run skips training, with the reason).", key="force_train",
    )
