"""A night's snapshot of a team's data: the list of its partitions' shards.

``SnapshotBuilder`` tells staging where the snapshot goes before anything is fetched
(``<staging_dir>/<name>/<snapshot id>/1.0.0``: a cache hit fetches nothing) and
prepares it: each partition's shards are made once (``partition_shards.ensure``: only
the partitions that landed since the last night are fetched and decoded), then
hard-linked into the snapshot's directory, one sub-directory per partition. The
snapshot directory is thus whole on its own (staging's manifest lists and checksums its
files, and ``verify`` checks them, as for ``digits`` or mnist), a link costs no copy,
and a partition's shards are freed on disk when the last snapshot linking them goes
(``staging_cleanup.py``).

What ``prepare`` returns goes into the staging manifest: the file entries (taken from
the partitions' records, not hashed again), the partitions, the labels (every
partition's class names, sorted), the shards per split in reading order, the rejected
files, and the statistics composed from the partitions' records
(``snapshot_statistics.py``). ``snapshot_reader.py`` reads it back.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from training.config import DatasetConfig
from training.data.snapshot import partition_shards, snapshot_statistics
from training.data.sources.images import Snapshot
from training.errors import DatasetError
from training.files import sha256_file

log = logging.getLogger(__name__)

VERSION = "1.0.0"
PARTITIONS = "partitions"  # <staging_dir>/<name>/partitions/: every partition's shards


def partitions_root(staging_dir: str | os.PathLike[str], name: str) -> Path:
    return Path(staging_dir) / name / PARTITIONS


def partitions_lock(root: Path) -> Path:
    """Held while partitions are made or linked (staging) or removed (clean-up)."""
    return root.with_name(root.name + ".lock")


class SnapshotBuilder:
    """Where this run's snapshot of the team's data is staged, and how it is prepared."""

    def __init__(self, cfg: DatasetConfig, store: Any) -> None:
        self.snapshot = Snapshot(cfg, store)
        self.version = VERSION
        self.data_dir = os.path.join(cfg.staging_dir, cfg.name, self.snapshot.id, VERSION)

    def prepare(self, statistics_key: str, wait_s: float) -> dict[str, Any]:
        """Make the partitions' shards that are missing and link every partition's into
        the snapshot directory (waiting up to ``wait_s`` for another staging of this
        dataset's partitions); what goes into the staging manifest (``files``
        included)."""
        from training.locks import claim

        snapshot, cfg = self.snapshot, self.snapshot.cfg
        root = partitions_root(cfg.staging_dir, cfg.name)
        root.mkdir(parents=True, exist_ok=True)
        target = Path(self.data_dir)
        made = 0
        with claim(partitions_lock(root), f"the partitions of {cfg.name} in {root}",
                   wait_s=wait_s):
            parts = []
            for partition in snapshot.partitions:
                part, new = partition_shards.ensure(snapshot, partition, root)
                parts.append(part)
                made += new
            entries = []
            for part in parts:  # linked while the lock keeps clean-up away
                entries += _link(part, target / part.name)
        records = [p.record for p in parts]
        labels = sorted({label for r in records for s in r["splits"].values()
                         for label in s["class_counts"]})
        if not labels:
            raise DatasetError(f"no readable example in the partitions of {cfg.uri!r}: "
                               f"{sum(len(r['rejected']) for r in records)} rejected")
        examples = {s: sum(r["splits"][s]["num_examples"] for r in records
                           if s in r["splits"]) for s in partition_shards.SPLITS}
        log.info("staging %s: %d partitions, %d decoded now, %d reused", cfg.name,
                 len(parts), made, len(parts) - made)
        extra = {
            "files": sorted(entries, key=lambda e: e["path"]),
            "partitions": list(snapshot.partitions),
            "partition_dirs": [p.name for p in parts],
            "labels": labels, "image_shape": list(snapshot.shape),
            "shards": {s: [f"{p.name}/{p.record['splits'][s]['file']}" for p in parts
                           if s in p.record["splits"]]
                       for s in partition_shards.SPLITS if examples[s]},
            "rejected": [x for r in records for x in r["rejected"]],
            "attempted": sum(r["attempted"] for r in records),
            "examples": examples,
            "partition_statistics": snapshot_statistics.by_partition(records, labels),
        }
        # Read as itself, validation_fraction plays no part; without a validation split,
        # staging computes the statistics by reading the images.
        if examples["validation"]:
            extra["statistics"] = {statistics_key: snapshot_statistics.composed(
                records, labels, snapshot.shape)}
        return extra


def _link(part: partition_shards.PartitionShards, into: Path) -> list[dict[str, Any]]:
    """Hard-link a partition's files into ``into`` (a copy where links are not
    possible); their manifest entries, paths relative to the snapshot directory."""
    into.mkdir(parents=True, exist_ok=True)
    names = [*part.files(), partition_shards.RECORD]
    for name in names:
        source, link = part.path / name, into / name
        if link.exists():
            link.unlink()
        try:
            os.link(source, link)
        except OSError:  # another file system, or one without hard links
            shutil.copy2(source, link)
    shards = {e["path"]: e for e in part.record["files"]}
    record = into / partition_shards.RECORD
    return [{**shards[name], "path": f"{into.name}/{name}"} for name in part.files()] + [
        {"path": f"{into.name}/{record.name}", "size": record.stat().st_size,
         "sha256": sha256_file(record)}]
