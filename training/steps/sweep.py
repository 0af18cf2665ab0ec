"""Step 3 of a run with a sweep: its trials, each an ordinary training run, then the pick.

The same three calls serve the DAG and the CLI, so a sweep runs the same way in both:

- ``plan(cfg, staged)``: the study opened (created, or loaded to continue) and one slot
  enqueued per trial; the slots. The DAG's ``validate_data`` hands them to the mapped
  ``trial`` task; ``python -m training run`` to its pool of ``sweep.parallel`` threads.
- ``run_trial(cfg, staged, slot, launch)``: slot ``slot``'s trial claimed (or found
  again on a retry), its config made (``training.sweep.trial``: the searched fields
  replaced, run id ``<run id>-t<slot>``) and handed to ``launch``, which trains it as
  ``train`` trains any run: a child ``python -m training train --trial-of BASE --trial
  N`` (the Airflow task's, or the CLI's), whose pruning callback reports each epoch to
  the study (``pruning_callbacks``, called in that child). Then the study is told how
  it ended: complete (the best epoch's objective, from the run's ``history.json``),
  pruned (told by the child), or failed with the reason. A child stopped by a signal (a
  task killed, a worker preempted) is not a failure of the trial: its reason is kept,
  the trial stays running, and the retry resumes it from its backup under the same
  slot. Any other failure is final (``TrialFailed``): retrying the same values fails
  the same way.
- ``pick(cfg, staged)``: once every trial has ended, the unfinished are failed, the
  best completed trial is picked (``training.sweep.pick``: an error naming every
  failure when none completed or more than ``sweep.max_failed`` failed), ``sweep.json``
  is written into its model directory and recorded for publishing; its config is
  returned, so evaluate, publish and promote take that trial's run as the run's model.

Nothing of Optuna leaks out of here: callers see slots, configs and small dicts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

from training import layout, produced
from training.config import RunConfig
from training.data.snapshot.staging import StagedDataset
from training.errors import ConfigError, LaunchError

log = logging.getLogger(__name__)

# Exit statuses of a child stopped from outside (SIGTERM passed on, SIGINT, SIGKILL):
# a retry resumes the trial, nothing is wrong with its values.
STOPPED = {128 + s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)}

Launch = Callable[[RunConfig, Sequence[str]], Any]
PICKED = "picked:"  # a study user attr per sweep: the trial its pick chose


class TrialFailed(LaunchError):
    """A trial failed for good (recorded in the study); the sweep goes on without it."""


def open_sweep(cfg: RunConfig, staged: StagedDataset) -> Any:
    """The run's sweep (``training.sweep.study.Sweep``), its trials keyed by the staged
    data's fingerprint; the database password from ``TRAINING_SWEEP_STORAGE_PASSWORD``
    (``training.deployment.sweep_password_from_env``)."""
    from training.deployment import sweep_password_from_env
    from training.sweep import study

    return study.open_study(cfg, staged.fingerprint, password=sweep_password_from_env())


def plan(cfg: RunConfig, staged: StagedDataset) -> list[int]:
    """Open the study and enqueue every slot (again after a crash: only what is missing);
    the slots, one trial task each."""
    from training.sweep import study

    sweep = open_sweep(cfg, staged)
    study.plan(sweep)
    log.info("sweep of run %s: %d trials, %d at a time, study %s in %s", cfg.run_id,
             cfg.sweep.trials, cfg.sweep.parallel, sweep.study.study_name, sweep.shown)
    return list(range(cfg.sweep.trials))


def label(slot: int, params: dict[str, Any]) -> str:
    """How the grid view names a trial: ``t2 learning_rate=0.0123 batch_size=64``."""
    def shown(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    return " ".join([f"t{slot}", *(f"{path.rsplit('.', 1)[-1]}={shown(value)}"
                                   for path, value in sorted(params.items()))])


def run_trial(cfg: RunConfig, staged: StagedDataset, slot: int, launch: Launch, *,
              base_config: str | os.PathLike[str], lanes: bool = False,
              announce: Callable[[str], None] = lambda label: None,
              on_full: Callable[[Any], None] | None = None,
              passes: tuple[type[BaseException], ...] = ()) -> dict[str, Any]:
    """Train slot ``slot``'s trial with ``launch(trial_cfg, flags)`` (module doc), the
    flags naming ``base_config`` (``cfg`` as a file the child reads); what it ended as:
    ``{"slot", "state", "run_id", "run_dir", "params", "value", "label"}``. ``lanes``
    (trial tasks that may all start at once): a new trial waits until fewer than
    ``sweep.parallel`` train. ``announce`` is told the trial's label once its values
    are known. ``on_full``: ``study.ask``'s (wait for a lane elsewhere); ``passes``: what
    ``launch`` raises to hand its wait elsewhere (a deferral): the trial stays as it is,
    running on its lane, for the task that resumes it."""
    from training.sweep import study, trial
    from training.tracking import tracker_from_env

    tracker_from_env().warm()  # MLflow loads in the sender process while the trial trains
    sweep = open_sweep(cfg, staged)
    ended = {"slot": slot, "run_id": trial.trial_run_id(cfg, slot),
             "run_dir": os.fspath(trial.trial_run_dir(cfg, slot))}
    if picked(sweep) is not None:  # the same run again after its pick: nothing to redo
        current = sweep.current(slot)
        params = dict(current.params) if current is not None else {}
        log.info("trial %d of run %s: the sweep was picked already", slot, cfg.run_id)
        return {**ended, "params": params, "label": label(slot, params), "state": "picked",
                "value": None}
    handle = study.ask(sweep, slot, lanes=cfg.sweep.parallel if lanes else 0,
                       on_full=on_full)
    ended |= {"params": handle.params, "label": label(slot, handle.params)}
    announce(ended["label"])
    if handle.finished or not handle.params:  # a task re-run after its trial ended
        log.info("trial %d of run %s already ended: %s", slot, cfg.run_id, handle.state)
        return {**ended, "state": handle.state, "value": None}
    log.info("trial %d of run %s (%s): %s", slot, cfg.run_id,
             "resumed" if handle.state == "running" else "new", ended["label"])
    try:
        trial_cfg = trial.trial_config(cfg, slot, handle.params)
    except ConfigError as exc:  # values the config refuses together
        study.tell(handle, "failed", reason=str(exc))
        _tracked_end(cfg, ended["run_id"], "failed", str(exc))
        raise TrialFailed(f"trial {slot} failed: {exc}") from exc
    try:
        launch(trial_cfg, ("--trial-of", os.fspath(base_config), "--trial", str(slot)))
    except ConfigError as exc:  # its values refused by the model or the machine
        study.tell(handle, "failed", reason=str(exc))
        _tracked_end(cfg, ended["run_id"], "failed", str(exc))
        raise TrialFailed(f"trial {slot} failed: {exc}") from exc
    except passes:
        raise  # the launch goes on elsewhere: the trial keeps running on its lane
    except LaunchError as exc:
        if getattr(exc, "exit_status", None) in STOPPED:
            study.tell(handle, "failed", reason=str(exc), final=False)
            raise  # stopped from outside: the retry resumes the trial from its backup
        study.tell(handle, "failed", reason=str(exc))
        _tracked_end(cfg, ended["run_id"], "failed", str(exc))
        raise TrialFailed(f"trial {slot} failed: {exc}") from exc
    except BaseException as exc:  # a timeout, a kill of the task, the unforeseen: its
        # reason kept and the lane let go, the trial left for its retry to resume
        study.tell(handle, "failed", reason=f"{type(exc).__name__}: {exc}", final=False)
        raise
    value = objective(trial_cfg)
    state = study.tell(handle, "complete", value=value)
    _tracked_end(cfg, ended["run_id"], state)
    log.info("trial %d of run %s: %s, %s %s", slot, cfg.run_id, state,
             cfg.fit.early_stopping_monitor, value)
    return {**ended, "state": state, "value": value}


def _tracked_end(cfg: RunConfig, run_id: str, state: str, reason: str = "") -> None:
    """The trial's end state (complete, pruned, failed with its reason) on its child
    run in MLflow, when tracking is on (``training.tracking``)."""
    from training.tracking import tracker_from_env

    tracker = tracker_from_env()
    tracker.end(cfg.model_name, run_id, state, reason, parent_run_id=cfg.run_id)
    tracker.flush()


def picked(sweep: Any) -> int | None:
    """The trial the sweep's pick chose, once it has (recorded in the study): a run
    started again after it trains no trial again and picks the same."""
    return sweep.study.user_attrs.get(f"{PICKED}{sweep.run_id}")


def objective(cfg: RunConfig) -> float | None:
    """The trial's objective from its ``history.json``: the early-stopping monitor at the
    best epoch when the best weights are restored, else at the last."""
    from training.sweep.engine import maximize

    path = layout.model_dir(cfg.run_dir()) / layout.HISTORY
    try:
        values = json.loads(path.read_text())["metrics"][cfg.fit.early_stopping_monitor]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not values:
        return None
    if not cfg.fit.restore_best_weights:
        return float(values[-1])
    return float(max(values) if maximize(cfg.fit.early_stopping_monitor) else min(values))


def pick(cfg: RunConfig, staged: StagedDataset) -> RunConfig:
    """The best completed trial's config, its ``sweep.json`` written and recorded for
    publishing (module doc); SweepRefused, one line naming the failed trials, when none
    completed or more than ``sweep.max_failed`` failed."""
    from training.sweep import engine, study, trial
    from training.sweep.pick import pick as best_of
    from training.sweep.record import SWEEP_JSON, counts, write_sweep_json

    sweep = open_sweep(cfg, staged)
    records = study.close(sweep)
    best = best_of(records, cfg)
    sweep.study.set_user_attr(f"{PICKED}{cfg.run_id}", best.number)
    chosen = trial.trial_config(cfg, best.number, best.params)
    run_dir = chosen.run_dir()
    write_sweep_json(layout.model_dir(run_dir), records, best, storage=sweep.shown,
                     study=sweep.study.study_name, objective=cfg.fit.early_stopping_monitor,
                     direction=engine.direction(cfg.fit.early_stopping_monitor),
                     space=cfg.sweep.space)
    produced.record(run_dir, "sweep", [SWEEP_JSON])
    tally = counts(records)
    log.info("sweep of run %s: best of %d trials (%d pruned, %d failed) is trial %d, %s "
             "%s: %s", cfg.run_id, tally["trials"], tally["pruned"], tally["failed"],
             best.number, cfg.fit.early_stopping_monitor, best.value,
             label(best.number, best.params))
    return chosen


def pruning_callbacks(base: RunConfig, staged: StagedDataset, slot: int) -> list[Any]:
    """In the trial's training process: the callback that reports each epoch's objective
    to slot ``slot``'s trial and stops it when pruned (or when the sweep's budget is
    spent). None under several workers (the config refuses a pruner there): the pick
    reads their objective from ``history.json``."""
    from training.sweep import study
    from training.sweep.pruning import PruningCallback

    if base.runtime.workers > 1:
        return []
    sweep = open_sweep(base, staged)
    handle = study.ask(sweep, slot)
    if handle.finished:
        return []
    end = study.deadline(sweep)
    return [PruningCallback(handle, base.fit.early_stopping_monitor,
                            deadline=end.timestamp() if end is not None else None)]


def base_of(path: str, trial_cfg: RunConfig, slot: int) -> RunConfig:
    """The sweep's config a trial's child is handed (``--trial-of``), checked to be the
    one this trial's config came from."""
    from training.sweep import trial

    base = RunConfig.from_file(path)
    expected = trial.trial_run_id(base, slot) if base.sweep.enabled else "none: no sweep"
    if expected != trial_cfg.run_id:
        raise ConfigError(f"--trial-of {path} is not the sweep trial {slot} of run "
                          f"{trial_cfg.run_id} comes from (its trial {slot}'s run id: "
                          f"{expected})")
    return base
