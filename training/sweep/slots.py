"""Which Optuna trial is trial task N's: the slots of one sweep in a study.

A study may hold several sweeps (``sweep.continue`` keeps one study per model, space
and objective from night to night), so every trial of a sweep carries user attrs,
written in the insert that creates it (``enqueue_trial``): ``sweep`` (the base run id),
``slot`` (N), ``attempt`` (0, then one more after each failure a task was re-run for)
and ``data_fingerprint`` (the staged data it trains on). A slot's **current** trial is
its latest attempt; of two trials of one attempt (two live processes for one task, which
Airflow prevents but a lost worker can cause), the first created: every process picks
the same one. Tonight's results are the current trials of tonight's run id; earlier
nights' trials only inform the sampler and the pruner, and give slot 0 its values
(``previous_best``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import PurePath
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from training.sweep.record import TrialRecord

log = logging.getLogger(__name__)

SWEEP, SLOT, ATTEMPT, DATA = "sweep", "slot", "attempt", "data_fingerprint"
ERROR, SKIPPED, FROM = "error", "skipped", "continued_from"
STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned",
          TrialState.FAIL: "failed", TrialState.RUNNING: "running",
          TrialState.WAITING: "waiting"}


def tonight(study: optuna.Study, run_id: str) -> list[FrozenTrial]:
    """Every trial of the sweep of ``run_id``, every slot and attempt."""
    return [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(SWEEP) == run_id and SLOT in t.user_attrs]


def current(study: optuna.Study, run_id: str, slot: int) -> FrozenTrial | None:
    """Slot ``slot``'s current trial (module doc), None before it is enqueued."""
    trials = [t for t in tonight(study, run_id) if t.user_attrs[SLOT] == slot]
    if not trials:
        return None
    return min(trials, key=lambda t: (-t.user_attrs.get(ATTEMPT, 0), t._trial_id))


def enqueue(study: optuna.Study, run_id: str, slot: int, *, attempt: int,
            data_fingerprint: str, params: Mapping[str, Any],
            extra: Mapping[str, Any] | None = None) -> None:
    """A waiting trial for ``slot``, its attrs in the same insert; ``params`` fixed
    (a grid point, the previous best, a failed attempt's values), the rest drawn when it
    is claimed."""
    study.enqueue_trial(dict(params), user_attrs={
        SWEEP: run_id, SLOT: slot, ATTEMPT: attempt, DATA: data_fingerprint,
        **(extra or {})})


def state(trial: FrozenTrial) -> str:
    """complete, pruned, failed, skipped (failed before it started: the budget), running
    or waiting."""
    if trial.state == TrialState.FAIL and trial.user_attrs.get(SKIPPED):
        return "skipped"
    return STATES[trial.state]


def previous_best(study: optuna.Study, run_id: str, maximize: bool) -> FrozenTrial | None:
    """The best completed trial of the latest earlier sweep in ``study``."""
    earlier = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
               if t.user_attrs.get(SWEEP) not in (None, run_id)]
    if not earlier:
        return None
    latest = max(earlier, key=lambda t: t.datetime_start or datetime.min)
    same = [t for t in earlier if t.user_attrs[SWEEP] == latest.user_attrs[SWEEP]]
    sign = -1 if maximize else 1
    return min(same, key=lambda t: (sign * t.value, t.user_attrs.get(SLOT, 0)))


def record(trial: FrozenTrial | None, slot: int, run_dir: str,
           data_fingerprint: str) -> TrialRecord:
    """A slot's current trial as ``sweep.json`` holds it (its run id: ``run_dir``'s
    last part)."""
    run_id = PurePath(run_dir).name
    if trial is None:
        return TrialRecord(number=slot, optuna_number=None, attempt=0, params={},
                           state="waiting", value=None, epochs={}, duration_s=None,
                           run_dir=run_dir, error="never planned nor asked",
                           data_fingerprint=data_fingerprint, run_id=run_id)
    start, end = trial.datetime_start, trial.datetime_complete
    return TrialRecord(
        number=slot, optuna_number=trial.number, attempt=trial.user_attrs.get(ATTEMPT, 0),
        params=dict(trial.params), state=state(trial), value=trial.value,
        epochs=dict(sorted(trial.intermediate_values.items())),
        duration_s=(end - start).total_seconds() if start and end else None,
        run_dir=run_dir, error=trial.user_attrs.get(ERROR, ""),
        data_fingerprint=trial.user_attrs.get(DATA, ""),
        continued_from=trial.user_attrs.get(FROM, ""), run_id=run_id)


def training(study: optuna.Study, run_id: str) -> list[FrozenTrial]:
    """The sweep's trials training now (running, no stop recorded), first claimed first."""
    found = [t for t in tonight(study, run_id)
             if t.state == TrialState.RUNNING and not t.user_attrs.get(ERROR)]
    return sorted(found, key=lambda t: (t.datetime_start or datetime.max, t.number))


def lanes_free(study: optuna.Study, run_id: str, lanes: int) -> bool:
    """Whether fewer than ``lanes`` of the sweep's trials train now."""
    return len(training(study, run_id)) < lanes


def claim_lane(storage: Any, study: optuna.Study, run_id: str, trial: FrozenTrial,
               lanes: int, *, wait: bool, poll_s: float = 2.0, pause: bool = True) -> bool:
    """Claim the waiting ``trial`` (waiting -> running) when fewer than ``lanes`` of its
    sweep's trials train; True when claimed. Two claims at the same moment may both
    pass the count: the later one (by start, then number) finds itself past ``lanes``
    and puts its trial back to waiting. False, after a pause (none without ``pause``:
    the caller waits elsewhere), when every lane is taken (``wait``: the first time, say
    so). A waiting trial waits for any trial to end, never for a given one, so no order
    of starting the tasks can deadlock them."""
    if lanes_free(study, run_id, lanes) and claim(storage, trial):
        if trial.number in [t.number for t in training(study, run_id)[:lanes]]:
            return True
        storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)
    if wait:
        log.info("trial %s waits for one of the %d trials training to end "
                 "(sweep.parallel)", trial.user_attrs.get(SLOT), lanes)
    if pause:
        time.sleep(poll_s + random.random())
    return False


def let_go(storage: Any, study: optuna.Study, run_id: str, slot: int, reason: str) -> bool:
    """Slot ``slot``'s trial, if it trains, stops counting as training (its ``reason``
    recorded, as ``study.tell`` records a stop for a retry to resume): its lane frees.
    For a trial stopped while no process of its own runs (a deferred task's trigger)."""
    trial = current(study, run_id, slot)
    if trial is None or trial.state != TrialState.RUNNING or trial.user_attrs.get(ERROR):
        return False
    storage.set_trial_user_attr(trial._trial_id, ERROR, reason[:2000])
    return True


def claim(storage: Any, trial: FrozenTrial) -> bool:
    """``trial`` from waiting to running, if it still waits: one conditional UPDATE, so of
    two processes claiming at once exactly one gets it, on SQLite as on PostgreSQL
    (Optuna's own ``set_trial_state_values`` reads, then writes: on SQLite both passed)."""
    import sqlalchemy
    from optuna.storages._rdb import models

    rdb = getattr(storage, "_backend", storage)  # Optuna's cache wrapper, if any
    row = models.TrialModel
    with rdb.engine.begin() as connection:
        done = connection.execute(
            sqlalchemy.update(row)
            .where(row.trial_id == trial._trial_id, row.state == TrialState.WAITING)
            .values(state=TrialState.RUNNING, datetime_start=datetime.now()))
    return done.rowcount == 1
