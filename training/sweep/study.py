"""A sweep's Optuna study through ask-and-tell: open it, plan the slots, ask for slot i
(again, on a retry), report and tell, read the trials back.

Trial task ``i`` (an Airflow mapped task, a CLI loop) owns **slot** ``i``. ``plan``,
called once by the step before the trial tasks, enqueues one waiting Optuna trial per
slot with the user attrs ``sweep`` (the base run id) and ``slot`` written in the same
insert, so no two processes ever create trials for one slot at once. ``ask(sweep, i)``
finds slot ``i``'s trial and claims it (waiting -> running is one row update under
``SELECT ... FOR UPDATE`` on PostgreSQL); a retry finds it running and resumes it, with
the values it drew; a finished one comes back as it finished. A slot whose trial was
told failed gets a new attempt (a new Optuna trial, same slot, same values: the trial's
run directory ``<run id>-t<i>`` and its backup still fit). Nothing here calls
``Study.ask``, which would pop any waiting trial, another slot's included.

A failure a retry may fix is told with ``final=False``: the reason is recorded and the
trial stays running for the retry. ``close`` fails whatever is left unfinished before
the pick. Each trial's draw is seeded by its slot (``engine.trial_seed``).

Over 300 lines on purpose, and why: open, plan, ask, tell and close are one protocol
over one study's rows (the slots, their attempts, the budget, the lanes), and a reader
checks a claim against its tell in one file.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from training.errors import StorageError
from training.sweep import budget, engine, slots, space
from training.sweep.record import TrialRecord
from training.sweep.slots import ATTEMPT, ERROR, FROM, SKIPPED, SWEEP
from training.sweep.storage import open_storage, shown_storage, storage_url
from training.sweep.trial import trial_run_dir

CLAIM_TRIES = 5
DRAW_WAIT_S = 10  # a resumed trial waits this long for the values its claimant draws


@dataclass
class Sweep:
    """An opened study and the sweep it serves: ``cfg`` (the base config), tonight's run
    id and the fingerprint of the data its trials train on."""

    cfg: Any
    study: optuna.Study
    storage: Any  # the Optuna storage (never printed: ``shown`` names it)
    url: str
    data_fingerprint: str

    @property
    def run_id(self) -> str:
        return self.cfg.run_id

    @property
    def shown(self) -> str:
        """The storage, as logs and sweep.json name it (no password)."""
        return shown_storage(self.url)

    @property
    def maximize(self) -> bool:
        return engine.maximize(self.cfg.fit.early_stopping_monitor)

    def current(self, slot: int) -> FrozenTrial | None:
        return slots.current(self.study, self.run_id, slot)


@dataclass
class TrialHandle:
    """Slot ``slot``'s trial: ``state`` is new (claimed now), running (resumed), complete,
    pruned or skipped; ``params`` its values by field path. The pruning callback reports
    through ``report`` and ``should_prune`` and stops with ``prune``."""

    sweep: Sweep
    slot: int
    state: str
    params: dict[str, Any]
    trial: optuna.Trial | None = None  # None once finished
    frozen: FrozenTrial | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.state in ("complete", "pruned", "skipped")

    def report(self, value: float, step: int) -> None:
        self.trial.report(value, step)

    def should_prune(self) -> bool:
        return self.trial.should_prune()

    def prune(self) -> str:
        return tell(self, "pruned")


def study_name(cfg: Any) -> str:
    """``<model name>.<key>`` with ``sweep.continue`` (the study carries over from night to
    night while the space and objective stay), else ``<model name>.<key>.<run id>``. The
    key is a hash of the space and the objective."""
    key = hashlib.sha256(json.dumps([cfg.sweep.space, cfg.fit.early_stopping_monitor],
                                    sort_keys=True).encode())
    name = f"{cfg.model_name}.{key.hexdigest()[:8]}"
    return name if cfg.sweep.continue_previous else f"{name}.{cfg.run_id}"


def open_study(cfg: Any, data_fingerprint: str, *, password: str | None = None) -> Sweep:
    """Create or load the study of ``cfg``'s sweep (``cfg.sweep.trials`` above 0);
    StorageError naming the storage (never a password) when it cannot be reached.
    ``password``: the database's, handed to the driver at connect time (docs/sweeps.md)."""
    url = storage_url(cfg)
    storage = open_storage(url, password)
    sweep = cfg.sweep
    try:
        study = optuna.create_study(
            storage=storage, study_name=study_name(cfg), load_if_exists=True,
            direction=engine.direction(cfg.fit.early_stopping_monitor),
            sampler=engine.make_sampler(sweep.sampler, sweep.trials, sweep.seed),
            pruner=engine.make_pruner(sweep.pruner, sweep.trials, cfg.fit.epochs))
    except Exception as exc:
        raise StorageError(f"the sweep's study storage {shown_storage(url)} refused the "
                           f"study {study_name(cfg)!r}: {type(exc).__name__}: "
                           f"{str(exc)[:300]}") from None
    return Sweep(cfg, study, storage, url, data_fingerprint)


def plan(sweep: Sweep) -> list[int]:
    """Enqueue a waiting trial for every slot that has none (grid: its point; with
    ``sweep.continue``, slot 0: the previous sweep's best values); returns the slots
    enqueued. Call it once, before the trial tasks start; again after a crash, it adds
    only what is missing, the same as the first time."""
    planned = {t.user_attrs[slots.SLOT] for t in slots.tonight(sweep.study, sweep.run_id)}
    added = [slot for slot in range(sweep.cfg.sweep.trials) if slot not in planned]
    for slot in added:
        _enqueue_planned(sweep, slot)
    budget.started(sweep.study, sweep.run_id)
    return added


def ask(sweep: Sweep, slot: int, *, lanes: int = 0,
        on_full: Callable[[Sweep], None] | None = None) -> TrialHandle:
    """Slot ``slot``'s trial: claimed (new), resumed (running), or as it finished. Its
    values are drawn when it is claimed, by a sampler seeded for the slot. ``lanes``: a
    new trial waits until fewer than that many of the sweep's trials train
    (``slots.claim_lane``): the DAG's trial tasks, which may all start at once.
    ``on_full``: called instead of pausing when every lane is taken, to wait elsewhere
    (it raises: a trial task defers to a trigger that watches the lanes)."""
    if not 0 <= slot < sweep.cfg.sweep.trials:
        raise ValueError(f"slot must be between 0 and {sweep.cfg.sweep.trials - 1}, got {slot}")
    tries = 0
    while tries < CLAIM_TRIES:
        tries += 1
        current = sweep.current(slot)
        if current is None:  # not planned (a sequential caller): plan this slot alone
            _enqueue_planned(sweep, slot)
            continue
        if current.state == TrialState.WAITING:
            if _budget_spent(sweep):
                return _skip(sweep, slot, current)
            if lanes:
                if not slots.claim_lane(sweep.storage, sweep.study, sweep.run_id, current,
                                        lanes, wait=tries == 1, pause=on_full is None):
                    if on_full is not None:
                        on_full(sweep)
                    tries -= 1  # every lane trains another trial: waiting is not a try
                    continue
                return _live(sweep, slot, current, "new")
            claimed = slots.claim(sweep.storage, current)
            return _live(sweep, slot, current, "new" if claimed else "running")
        if current.state == TrialState.RUNNING:
            if current.user_attrs.get(ERROR):  # a retry resumes it: it trains again
                sweep.storage.set_trial_user_attr(current._trial_id, ERROR, "")
            return _live(sweep, slot, current, "running")
        if slots.state(current) == "failed":  # a task re-run after a failure: new attempt
            slots.enqueue(sweep.study, sweep.run_id, slot,
                          attempt=current.user_attrs.get(ATTEMPT, 0) + 1,
                          data_fingerprint=sweep.data_fingerprint, params=current.params,
                          extra={FROM: current.user_attrs[FROM]}
                          if FROM in current.user_attrs else None)
            continue
        return TrialHandle(sweep, slot, slots.state(current), dict(current.params),
                           frozen=current)
    raise StorageError(f"slot {slot} of sweep {sweep.run_id} in {sweep.shown}: no trial "
                       f"could be claimed in {CLAIM_TRIES} tries")


def tell(handle: TrialHandle, state: str, value: float | None = None, reason: str = "",
         *, final: bool = True) -> str:
    """Finish the trial: ``complete`` (``value``, else the best epoch's reported value, or
    the last one without ``fit.restore_best_weights``), ``pruned``, or ``failed`` with its
    ``reason`` (recorded; ``final=False`` keeps the trial running for a retry). Returns
    the trial's state, which may be the one it was told first (a second tell is ignored)."""
    if state not in ("complete", "pruned", "failed"):
        raise ValueError(f"state must be 'complete', 'pruned' or 'failed', got {state!r}")
    if handle.finished:
        return handle.state
    storage, trial_id = handle.sweep.storage, handle.trial._trial_id
    if state == "failed":
        storage.set_trial_user_attr(trial_id, ERROR, reason[:2000])
        if not final:
            return "running"
    if state == "complete":
        value = _objective(handle) if value is None else value
        if value is None or not math.isfinite(value):
            monitor = handle.sweep.cfg.fit.early_stopping_monitor
            return tell(handle, "failed", reason=f"no finite objective ({monitor}), got {value}")
        done = handle.sweep.study.tell(handle.trial, value, skip_if_finished=True)
    else:
        done = handle.sweep.study.tell(
            handle.trial, state=TrialState.PRUNED if state == "pruned" else TrialState.FAIL,
            skip_if_finished=True)
    handle.state, handle.frozen, handle.trial = slots.state(done), done, None
    return handle.state


def close(sweep: Sweep) -> list[TrialRecord]:
    """Fail every trial of tonight's still waiting or running (its recorded reason, or
    that it never finished; one not started once the budget is spent is skipped); the
    records, slot by slot. Call it before the pick, once
    every trial task has ended."""
    for slot in range(sweep.cfg.sweep.trials):
        current = sweep.current(slot)
        if current is not None and current.state == TrialState.WAITING and \
                _budget_spent(sweep):
            _skip(sweep, slot, current)
        elif current is not None and current.state in (TrialState.WAITING,
                                                       TrialState.RUNNING):
            reason = current.user_attrs.get(ERROR) or (
                "never started: its trial task did not run" if current.state ==
                TrialState.WAITING else "did not finish: its trial task ended without a tell")
            sweep.storage.set_trial_user_attr(current._trial_id, ERROR, reason)
            sweep.storage.set_trial_state_values(current._trial_id, TrialState.FAIL)
    return records(sweep)


def records(sweep: Sweep) -> list[TrialRecord]:
    """Every slot's current trial as a record (``training.sweep.record``)."""
    return [slots.record(sweep.current(slot), slot, str(trial_run_dir(sweep.cfg, slot)),
                         sweep.data_fingerprint)
            for slot in range(sweep.cfg.sweep.trials)]


# --- drawing a slot's values ----------------------------------------------------------
def _enqueue_planned(sweep: Sweep, slot: int) -> None:
    """Enqueue slot ``slot`` with the values fixed before it draws: its grid point, or
    (``sweep.continue``, slot 0) the previous sweep's best."""
    cfg, params, extra = sweep.cfg.sweep, {}, None
    if cfg.sampler == "grid":
        seed = engine.trial_seed(cfg.seed, sweep.run_id, -1)
        params = space.grid_points(cfg.params, cfg.trials, seed)[slot]
    elif slot == 0 and cfg.continue_previous:
        previous = slots.previous_best(sweep.study, sweep.run_id, sweep.maximize)
        if previous is not None:
            params = dict(previous.params)
            extra = {FROM: f"{previous.user_attrs[SWEEP]}-t{previous.user_attrs[slots.SLOT]}"}
    slots.enqueue(sweep.study, sweep.run_id, slot, attempt=0,
                  data_fingerprint=sweep.data_fingerprint, params=params, extra=extra)


def _live(sweep: Sweep, slot: int, frozen: FrozenTrial, state: str) -> TrialHandle:
    """A claimed trial with its values drawn, or a resumed one with the values it drew.
    A trial resumed while the process that claimed it is still drawing (two processes for
    one slot) waits for its values rather than drawing others."""
    cfg = sweep.cfg.sweep
    waited = time.monotonic() + DRAW_WAIT_S
    while state == "running" and time.monotonic() < waited and \
            set(cfg.params) - set(sweep.storage.get_trial(frozen._trial_id).params):
        time.sleep(0.1)
    sweep.study.sampler = engine.make_sampler(
        cfg.sampler, cfg.trials, engine.trial_seed(cfg.seed, sweep.run_id, slot))
    trial = optuna.Trial(sweep.study, frozen._trial_id)
    params = {path: _suggest(trial, p) for path, p in sorted(cfg.params.items())}
    return TrialHandle(sweep, slot, state, params, trial=trial)


def _suggest(trial: optuna.Trial, param: space.Param) -> Any:
    if param.kind == "float":
        return trial.suggest_float(param.path, param.low, param.high, log=param.log,
                                   step=param.step)
    if param.kind == "int":
        return trial.suggest_int(param.path, int(param.low), int(param.high),
                                 log=param.log, step=int(param.step or 1))
    return trial.suggest_categorical(param.path, list(param.choices))


def _objective(handle: TrialHandle) -> float | None:
    values = list(handle.sweep.storage.get_trial(handle.trial._trial_id)
                  .intermediate_values.values())
    if not values:
        return None
    if not handle.sweep.cfg.fit.restore_best_weights:
        return values[-1]
    return max(values) if handle.sweep.maximize else min(values)


# --- the budget (training.sweep.budget) -----------------------------------------------
def deadline(sweep: Sweep) -> datetime | None:
    """When the sweep's budget (``sweep.timeout_minutes``) is spent; None: no budget.
    ``PruningCallback(deadline=deadline(sweep).timestamp())`` stops a trial then."""
    return budget.deadline(sweep.study, sweep.run_id, sweep.cfg.sweep.timeout_minutes)


def _budget_spent(sweep: Sweep) -> bool:
    return budget.spent(sweep.study, sweep.run_id, sweep.cfg.sweep.timeout_minutes)


def _skip(sweep: Sweep, slot: int, frozen: FrozenTrial) -> TrialHandle:
    minutes = sweep.cfg.sweep.timeout_minutes
    sweep.storage.set_trial_user_attr(frozen._trial_id, SKIPPED, True)
    sweep.storage.set_trial_user_attr(
        frozen._trial_id, ERROR, f"not started: the sweep's budget of {minutes} minutes "
        "(sweep.timeout_minutes) was spent")
    sweep.storage.set_trial_state_values(frozen._trial_id, TrialState.FAIL)
    return TrialHandle(sweep, slot, "skipped", {}, frozen=frozen)
