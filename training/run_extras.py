"""What a ``python -m training`` command hands training beside its config.

A sweep trial's pruning callback and its sweep's run (``--trial-of``, ``--trial``), the
tracker's per-epoch callback (the chief's only; ``training.tracking``), whether others
log to this process's run, and ``--data-stats``: small pieces that ``training.cli`` asks
for, kept here so that the CLI module stays the parser and the order of the steps.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from training.config import RunConfig
from training.errors import ConfigError
from training.train import cluster


def trial_of(args: argparse.Namespace, cfg: RunConfig, staged: Any) -> str | None:
    """A sweep trial's sweep run (``--trial-of``): its MLflow run's parent."""
    if getattr(args, "trial", None) is None:
        return None
    from training.steps import sweep

    return sweep.base_of(args.trial_of, cfg, args.trial).run_id


def others_track(args: argparse.Namespace, cfg: RunConfig) -> bool:
    """Whether processes this one starts log to its MLflow run: a sweep's trials (child
    runs under it), a local launcher's chief worker, a child of the other Keras backend.
    Each finds the run by its tag, and makes it when none has it yet, so the run must
    exist before they start (``tracker.flush`` after ``start``)."""
    from training import backend

    return ((args.command == "run" and cfg.sweep.enabled)
            or (cfg.runtime.workers > 1 and not cluster.current())
            or cfg.runtime.backend != backend.chosen())


def tracking_callbacks(tracker: Any, cfg: RunConfig) -> list[Any]:
    """Each epoch's scalars to the tracker, from the chief only (none when off)."""
    if not tracker.enabled or not cluster.is_chief(cluster.current()):
        return []
    from training.train.callbacks.epoch_tracking import EpochTracking

    return [EpochTracking(tracker, cfg.model_name, cfg.run_id)]


def trial_callbacks(args: argparse.Namespace, cfg: RunConfig, staged: Any) -> list[Any]:
    """A sweep trial's pruning callback (``--trial-of``, ``--trial``); none otherwise."""
    if getattr(args, "trial", None) is None:
        return []
    from training.steps import sweep

    base = sweep.base_of(args.trial_of, cfg, args.trial)
    return sweep.pruning_callbacks(base, staged, args.trial)


def data_stats(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        with open(path) as file:
            stats = json.load(file)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--data-stats {path} is not readable JSON ({exc})") from None
    if not isinstance(stats, dict):
        raise ConfigError(f"--data-stats {path} must hold a JSON object, got "
                          f"{type(stats).__name__}")
    return stats


