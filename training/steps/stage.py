"""Step 1, stage: the run's dataset prepared once into the staging directory.

``stage`` prepares it (``training.data.snapshot.staging``: fetched, split, fingerprinted,
manifested), or takes the staged dataset a step before handed over and verifies it.
Already done for this run? ``cached``: the staged copy of this very dataset, found
without importing tensorflow-datasets (the Airflow task's 0.01 s check).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from training.config import RunConfig
from training.data.input import decoded_copy
from training.data.snapshot import staging
from training.data.snapshot.staging import StagedDataset
from training.errors import ConfigError, DatasetError

log = logging.getLogger(__name__)


def cached(cfg: RunConfig, store_options: Any = None) -> StagedDataset | None:
    """The staged dataset of this config if it is already staged and complete (with its
    decoded copy, when ``dataset.decoded_copy`` asks for one); else None."""
    staged = staging.cached(cfg.dataset, store_options)
    if staged is not None and cfg.dataset.decoded_copy and decoded_copy.missing(
            Path(staged.path), _split_names(cfg, staged)):
        return None
    return staged


def stage(cfg: RunConfig, staged_file: str | None = None) -> StagedDataset:
    """The run's staged dataset: the one a previous step handed over (``staged_file``,
    the JSON ``stage`` printed), verified, else staged now (cached by its inputs). With
    ``dataset.decoded_copy``, staging now also decodes its splits once
    (``decoded_copy.py``, on the staging worker's CPUs); a dataset handed over must
    already have that copy (a training pod does not decode the whole split itself)."""
    if not staged_file:
        staged = staging.stage(cfg.dataset)
        _decoded_copy(cfg, staged)
        return staged
    staged = StagedDataset.read(staged_file)
    version = cfg.dataset.version
    if staged.name != cfg.dataset.name or version not in (None, staged.version):
        asked = cfg.dataset.name + (f":{version}" if version else "")
        raise ConfigError(f"--staged {staged_file} holds dataset {staged.key!r}, but the "
                          f"config asks for {asked!r}: stage this config's dataset, or "
                          "leave --staged out")
    staging.verify(staged)
    log.info("using the staged dataset %s from %s", staged.key, staged_file)
    if cfg.dataset.decoded_copy:
        absent = decoded_copy.missing(Path(staged.path), _split_names(cfg, staged))
        if absent:
            raise DatasetError(
                f"dataset.decoded_copy is true, but dataset {staged.key} handed over in "
                f"--staged {staged_file} has no decoded copy of split(s) "
                f"{', '.join(map(repr, absent))}: stage it with this config (python -m "
                "training stage, or the DAG's stage_dataset task), or set "
                "dataset.decoded_copy to false")
    return staged


def _split_names(cfg: RunConfig, staged: StagedDataset) -> list[str]:
    from training.data.input.staged_arrays import StagedArrays
    from training.data.snapshot.splits import split_names

    return list(split_names(StagedArrays(staged), cfg.dataset.validation_fraction).values())


def _decoded_copy(cfg: RunConfig, staged: StagedDataset) -> None:
    if cfg.dataset.decoded_copy:
        written = decoded_copy.ensure(Path(staged.path), _split_names(cfg, staged))
        log.info("dataset %s: decoded copy %s", staged.key,
                 f"written for {', '.join(written)}" if written else "already there")


def stage_elsewhere(cfg: RunConfig, staged_file: str | None = None) -> StagedDataset:
    """``stage`` for a process that must not import TensorFlow (a JAX training process):
    the staged dataset handed over is verified here (no TensorFlow needed); otherwise it
    is staged by a child process (``python -m training stage``)."""
    if staged_file:
        return stage(cfg, staged_file)
    import sys
    from pathlib import Path

    from training import backend
    from training.launch import processes
    from training.launch.local import stage_subprocess

    with processes.scratch_dir("stage-") as tmp:  # left by a SIGKILL: removed next time
        config_path = cfg.write(Path(tmp))
        staged = StagedDataset.from_dict(stage_subprocess(
            config_path, sys.executable, backend.child_env("tensorflow")))
    staging.verify(staged)
    return staged
