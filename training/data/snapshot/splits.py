"""The split expressions training reads: train, validation (carved from train when the
dataset has none) and test.

Everything that reads a staged dataset's splits takes them from here, on any reader of
its files (a tfds builder, ``snapshot_reader.SnapshotReader``,
``input/staged_arrays.StagedArrays``): staging's statistics (which depend on them:
``staging.statistics_key``), the validate step, the decoded copy's files and training's
input.
"""

from __future__ import annotations

from typing import Any

from training.errors import DatasetError


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
