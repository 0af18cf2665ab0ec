"""A team's snapshot (``images.Snapshot``) as a tensorflow-datasets dataset.

``SnapshotBuilder`` tells staging where the snapshot goes before anything is fetched
(``<staging_dir>/<name>/<snapshot id>/1.0.0``: a cache hit fetches nothing) and
prepares it: every file fetched and decoded (``images.prepare_examples``), then the
``OwnImages`` builder (a ``GeneratorBasedBuilder`` made once the labels are known)
writes the shards that staging's manifest then lists.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from training.config import DatasetConfig
from training.data.images import Snapshot, prepare_examples
from training.errors import DatasetError

VERSION = "1.0.0"


class SnapshotBuilder:
    """Where this run's snapshot of the team's data is staged, and how it is prepared.

    Staging (``staging.stage``) needs the directory before anything is fetched (a cache
    hit fetches nothing); the tfds builder is made in ``prepare``, once the labels are
    known."""

    def __init__(self, cfg: DatasetConfig, store: Any) -> None:
        self.snapshot = Snapshot(cfg, store)
        self.version = VERSION
        self.data_dir = os.path.join(cfg.staging_dir, cfg.name, self.snapshot.id, VERSION)

    def prepare(self) -> dict[str, Any]:
        """Fetch, decode and write the snapshot's tfds shards; what goes into the staging
        manifest besides the files (partitions, labels, rejected files, split sizes)."""
        snapshot = self.snapshot
        with tempfile.TemporaryDirectory(prefix="own-images-") as tmp:
            prepared = prepare_examples(snapshot, Path(tmp))
            if not prepared["labels"]:
                raise DatasetError(f"no readable example in the partitions of "
                                   f"{snapshot.cfg.uri!r}: {len(prepared['rejected'])} "
                                   "rejected")
            builder = _tfds_builder(snapshot, prepared, Path(tmp))
            builder.download_and_prepare()
        if os.path.realpath(builder.data_dir) != os.path.realpath(self.data_dir):
            raise DatasetError(f"tfds prepared {builder.data_dir}, expected {self.data_dir}")
        return {"partitions": list(snapshot.partitions), "labels": prepared["labels"],
                "rejected": prepared["rejected"], "attempted": prepared["attempted"],
                "examples": {s: len(e) for s, e in prepared["splits"].items()},
                "partition_statistics": prepared["partition_statistics"]}


def _tfds_builder(snapshot: Snapshot, prepared: dict[str, Any], cache: Path) -> Any:
    import numpy as np
    import tensorflow_datasets as tfds

    cfg = snapshot.cfg
    height, width, channels = snapshot.shape

    class OwnImages(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version(VERSION)
        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=snapshot.id)]
        name = cfg.name

        def _info(self) -> Any:
            return self.dataset_info_from_configs(
                description=f"{cfg.source} under {cfg.uri}: "
                            + ", ".join(snapshot.partitions),
                features=tfds.features.FeaturesDict({
                    "image": tfds.features.Image(shape=(height, width, channels)),
                    "label": tfds.features.ClassLabel(names=prepared["labels"]),
                }),
                supervised_keys=("image", "label"),
            )

        def _split_generators(self, dl_manager: Any) -> Any:
            del dl_manager
            return {split: self._generate_examples(examples)
                    for split, examples in prepared["splits"].items() if examples}

        def _generate_examples(self, examples: list[tuple[str, str, str]]) -> Any:
            for key, label, name in examples:
                yield key, {"image": np.load(cache / name), "label": label}

    return OwnImages(data_dir=os.fspath(cfg.staging_dir), config=snapshot.id)
