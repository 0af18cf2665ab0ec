"""A team's snapshot's statistics, composed from its partitions' records.

``statistics.dataset_statistics`` reads every image of a dataset; a snapshot of a
team's data need not: each partition's ``partition.json`` (``partition_shards.py``)
keeps, per split, the class counts, the exact per-channel pixel sums and squares and
every image's content hash, in reading order. Adding those up gives the same statistics
(``statistics.FORMAT``: class counts, pixel mean and std, duplicates across splits) in
milliseconds, however many days the snapshot holds; and ``by_partition`` gives each
day's own figures for ``validation.py``'s drift check.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

from training.data.snapshot.statistics import FORMAT, count_duplicate


def _mean_std(pixels: int, sums: list[int], squares: list[int]
              ) -> tuple[list[float] | None, list[float] | None]:
    """As ``statistics._Moments``: exact in integers, the population std."""
    if not pixels:
        return None, None
    return ([s / pixels for s in sums],
            [math.sqrt(max(pixels * q - s * s, 0) / (pixels * pixels))
             for s, q in zip(sums, squares, strict=True)])


def _added(parts: Sequence[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """Split records (``partition.json``'s ``splits`` values) added up."""
    channels = len(parts[0]["sums"]) if parts else 0
    counts = {label: 0 for label in labels}
    pixels, sums, squares = 0, [0] * channels, [0] * channels
    for part in parts:
        for label, count in part["class_counts"].items():
            counts[label] += count
        pixels += part["pixels"]
        sums = [a + b for a, b in zip(sums, part["sums"], strict=True)]
        squares = [a + b for a, b in zip(squares, part["squares"], strict=True)]
    mean, std = _mean_std(pixels, sums, squares)
    return {"num_examples": sum(p["num_examples"] for p in parts),
            "class_counts": [counts[label] for label in labels],
            "pixel_mean": mean, "pixel_std": std}


def _in_turn(lists: Sequence[list[str]]) -> Iterator[str]:
    """One item of each list in turn, as ``snapshot_reader`` reads a split's files."""
    for row in itertools.zip_longest(*lists):
        yield from (item for item in row if item is not None)


def composed(records: Sequence[dict[str, Any]], labels: list[str],
             shape: Sequence[int]) -> dict[str, Any]:
    """The snapshot's ``statistics.FORMAT`` statistics: splits train, validation, test
    (each read as itself, its files in turn in the order of ``records``, as
    ``snapshot_reader`` reads them)."""
    seen: dict[str, tuple[str, int]] = {}
    duplicates: dict[str, Any] = {"count": 0, "within_split": 0, "examples": []}
    splits = {}
    for split in ("train", "validation", "test"):
        parts = [r["splits"][split] for r in records if split in r["splits"]]
        for index, digest in enumerate(_in_turn([part["hashes"] for part in parts])):
            count_duplicate(digest, (split, index), seen, duplicates)
        added = _added(parts, labels)
        splits[split] = {"split": split, **added,
                         "image_shape": list(shape) if added["num_examples"] else None,
                         "image_dtype": "uint8" if added["num_examples"] else None}
    return {"format": FORMAT, "label_names": labels, "num_classes": len(labels),
            "image_shape": list(shape), "image_dtype": "uint8", "splits": splits,
            "duplicates": duplicates}


def by_partition(records: Sequence[dict[str, Any]], labels: list[str]
                 ) -> dict[str, dict[str, Any]]:
    """Each partition's examples, class counts (in ``labels`` order) and per-channel
    pixel mean and std (0-255) over all its splits: what ``validation.py`` compares a
    new day with, on its own, so one drifted day is not diluted by the days before."""
    out = {}
    for record in records:
        added = _added(list(record["splits"].values()), labels)
        if not added["num_examples"]:
            continue
        out[record["partition"]] = {
            "num_examples": added["num_examples"], "class_counts": added["class_counts"],
            "pixel_mean": [round(m, 4) for m in added["pixel_mean"]],
            "pixel_std": [round(s, 4) for s in added["pixel_std"]]}
    return out
