"""Step 5, publish: the run's model as an immutable, checksummed version in the store.

``publish`` uploads exactly what the steps before recorded of the run's ``model/``
(``training.produced``; a file nobody recorded is left out and named) as version
``<run_id>`` (``training.registry.versions``), with the evaluation's metrics and an
``MLmodel`` file that makes the version folder an MLflow model (``training.tracking``). Already
done for this run? The registry's own rule: identical bytes under the same version are
a no-op, so a retry completes an interrupted upload, and other bytes are refused.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from training import layout, produced
from training.config import RunConfig
from training.errors import RegistryError, shown
from training.layout import model_dir
from training.locks import claim_run
from training.registry.versions import ModelRegistry
from training.steps import run_dir_of
from training.steps.evaluate import read_evaluation
from training.tracking.mlmodel import write_mlmodel

log = logging.getLogger(__name__)


def publish(cfg: RunConfig, registry: ModelRegistry, *, created: str,
            source: dict[str, str] | None = None,
            run_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Upload what the run's steps recorded (``produced``) as version ``cfg.run_id``.

    ``created`` comes from the caller (the Airflow run's date, or the time training
    started: ``started_at``), never the clock at upload, so a retry writes the same
    manifest. ``source`` names what produced the version (the Airflow DAG run).
    """
    run_dir = run_dir_of(cfg, run_dir)
    with claim_run(run_dir, cfg.run_id):
        evaluation = read_evaluation(cfg, run_dir)
        metrics = {k: evaluation["challenger"][k] for k in ("accuracy", "loss", "macro_f1")}
        # The version is an MLflow model where it lies (training.tracking.mlmodel)
        write_mlmodel(model_dir(run_dir), run_id=cfg.run_id, created=created,
                      backend=cfg.runtime.backend)
        produced.record(run_dir, "publish", [layout.MLMODEL])
        manifest = registry.publish(cfg.model_name, cfg.run_id, model_dir(run_dir),
                                    run_id=cfg.run_id, created=created, metrics=metrics,
                                    source=source, max_bytes=cfg.storage.max_version_mb << 20,
                                    only=produced.to_publish(run_dir))
    summary = {"model_name": cfg.model_name, "version": cfg.run_id,
               "store_uri": cfg.storage.store_uri, "files": len(manifest["files"]),
               "metrics": manifest["metrics"]}
    log.info("published %s version %s (%d files) to %s", cfg.model_name, cfg.run_id,
             summary["files"], cfg.storage.store_uri)
    return summary


def started_at(cfg: RunConfig) -> str:
    """When the run's training started, as recorded in ``run.json`` (ISO 8601): the
    version's ``created`` time when the CLI publishes."""
    path = model_dir(cfg.run_dir()) / layout.RUN
    try:
        return json.loads(path.read_text())["started_at"]
    except (OSError, ValueError, KeyError) as exc:
        raise RegistryError(f"run {cfg.run_id} has no readable {path} ({shown(exc)}): train "
                            "it before publishing") from None
