"""Step 2, validate: is there anything new, and is the data fit to train on?

``validate_data`` is the DAG's ``validate_data`` task (and the CLI's ``validate``),
between staging and training. Already done for this run? It skips the run when
production was trained on the same snapshot with the same recipe (the nightly "nothing
new" rule); otherwise it checks the staged data (``training.data.snapshot.validation``) against
the run's rules and production's published statistics, failing the run with every
reason before anything trains.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from training import layout
from training.config import RunConfig
from training.data.snapshot import staging
from training.data.snapshot.snapshot_reader import staged_builder
from training.data.snapshot.splits import split_names
from training.data.snapshot.staging import StagedDataset
from training.errors import TrainingError
from training.registry.versions import ModelRegistry

log = logging.getLogger(__name__)


def validate_data(cfg: RunConfig, staged: StagedDataset,
                  registry: ModelRegistry) -> dict[str, Any]:
    """Check the staged data before any training; decide whether there is anything new.

    Returns ``{"skip": True, "reason": ...}`` when production (another run's version)
    was trained on this very snapshot with this very recipe
    (``RunConfig.recipe_fingerprint``: the config but for where things go and which
    dates were asked for), unless ``validation.force_train``.
    Otherwise computes the data's statistics, checks them (``training.data.snapshot.validation``)
    against the rules and production's published statistics, and returns them with the
    verdict (``data_stats``: ``evaluate`` writes it as ``data_stats.json``, published
    with the version); raises ``ValidationError`` with every reason when a check fails.
    """
    from training.data.snapshot import validation

    name = cfg.model_name
    champion = registry.production(name)
    trained_on = published_json(registry, name, champion, layout.RUN).get("dataset", {})
    if (champion != cfg.run_id  # a re-run of this very run completes it instead
            and trained_on.get("fingerprint") == staged.fingerprint
            and _recipe(registry, name, champion) == cfg.recipe_fingerprint()
            and not cfg.validation.force_train):
        reason = (f"nothing new: production ({name} {champion}) was trained on this data "
                  f"({staged.key}) with these settings; set force_train to train anyway")
        log.info("%s", reason)
        return {"skip": True, "reason": reason, "dataset": staged.key}
    staging.verify(staged)
    manifest = staging.read_manifest(Path(staged.path) / layout.STAGING_MANIFEST)
    stats = manifest.get("statistics", {}).get(
        staging.statistics_key(cfg.dataset.validation_fraction))
    if stats is None:  # staged before statistics were kept: computed here (TensorFlow)
        builder = staged_builder(staged)
        stats = validation.dataset_statistics(
            builder, split_names(builder, cfg.dataset.validation_fraction))
    if "partition_statistics" in manifest:  # a team's own data: each day on its own too
        stats = {**stats, "partitions": manifest["partition_statistics"]}
    rejected = ({"rejected": manifest["rejected"], "attempted": manifest["attempted"]}
                if "rejected" in manifest else None)
    rules = validation.ValidationRules(
        min_examples_per_class=cfg.validation.min_examples_per_class,
        max_corrupt_fraction=cfg.validation.max_corrupt_fraction,
        drift_threshold=cfg.validation.drift_threshold,
        expected_shape=(tuple(int(n) for n in cfg.dataset.image_shape.split("x"))
                        if cfg.dataset.image_shape else None))
    reference = published_json(registry, name, champion, layout.DATA_STATS)
    verdict = validation.validate(stats, rules=rules, reference=reference.get("statistics"),
                                  rejected=rejected)
    for check in verdict["checks"]:
        log.info("data check %s: %s (%s)", check["name"],
                 "passed" if check["passed"] else "FAILED", check["detail"])
    validation.require_valid(verdict)
    return {"skip": False, "dataset": staged.key,
            "data_stats": {"dataset": staged.key,
                           "compared_with": champion if reference else None,
                           "statistics": stats, "verdict": verdict}}


def _recipe(registry: ModelRegistry, name: str, version: str | None) -> str | None:
    """The recipe fingerprint of a published version's config (None if unreadable)."""
    try:
        return RunConfig.from_dict(
            published_json(registry, name, version, layout.CONFIG)).recipe_fingerprint()
    except (TrainingError, ValueError, TypeError):
        return None


def published_json(registry: ModelRegistry, name: str, version: str | None,
                    filename: str) -> dict[str, Any]:
    """A JSON file published with ``version`` (empty when there is none or no such file)."""
    if version is None:
        return {}
    key = layout.version_key(name, version, filename)
    if not registry.store.exists(key):
        return {}
    return json.loads(registry.store.get_bytes(key))


