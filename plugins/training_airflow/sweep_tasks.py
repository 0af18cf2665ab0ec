"""A sweep's steps in the DAG: one mapped ``trial`` task per trial, and the pick in ``train``.

A run whose config has a sweep (``sweep.trials`` above 0, docs/sweeps.md) trains in
the mapped ``TrialOperator``: ``plan_trials`` opens the study and returns the slots
(none without a sweep, so the mapped task expands to nothing and is skipped: Airflow
maps only over a return value), one task instance per slot, named in the grid by its
values (``map_index_template``). Each runs ``training.steps.sweep.run_trial`` with this task's
launcher: ``python -m training train --trial-of ... --trial N`` as its child
(``Step.run_command``, the connection's credentials in its environment), or a Job of
its own under ``launcher=kubernetes``. A new trial is claimed only while fewer than
``sweep.parallel`` of the sweep's trials train (else its task waits for any of them to
end), so at most that many train at once whatever the pool lets start. With
``TRAINING_DEFERRABLE`` (the default) neither wait holds a worker slot: a trial that finds
every lane taken defers to a ``lane_trigger.LaneTrigger`` and claims its lane when it
resumes, and under ``launcher=kubernetes`` a trial defers while its Job trains
(``job_trigger.TrainingJobTrigger``; its trial stays running on its lane meanwhile). A
trial killed (a
task timed out, a worker lost) fails its try and is retried: it resumes its backup under
the same slot. A trial that fails for good is recorded in the study and fails its task
without retries; the sweep goes on.

Then ``train`` (``TRIGGER_RULE``: it runs once every trial has ended, however they
ended) picks the best trial (``pick``): its frozen config goes on in XCom ``config``,
and ``evaluate``, ``publish`` and ``promote`` take that trial's run as the run's model,
as they take a run ``train`` trained. There is no second training.
"""

from __future__ import annotations

import os
from typing import Any

from training_airflow.step import CONFIG_XCOM, Step

LABEL = "trial_label"  # the context key map_index_template reads
MAP_INDEX_TEMPLATE = "{{ " + LABEL + " }}"
TRIGGER_RULE = "all_done"  # train: after every trial, whatever became of it
MAX_PARALLEL_TASKS = 64  # training.config.sweep.MAX_PARALLEL: the study keeps the run's
LANE_POLL_S = 5.0  # seconds between a deferred trial's looks for a free lane


class PlanTrialsOperator(Step):
    """The sweep's study opened and its slots enqueued, after ``validate_data``; XCom: the
    slots, one ``trial`` task each (an empty list without a sweep: no trial runs)."""

    template_fields = ("staged", "validated")
    imports = ("training_airflow.store",)
    ui_color = "#ffe8cc"

    def __init__(self, *, staged: Any, validated: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.validated = staged, validated

    def work(self, cfg: Any, context: Any) -> list[int]:
        if not cfg.sweep.enabled:
            return []
        from training.data.snapshot.staging import StagedDataset
        from training.steps import sweep

        return sweep.plan(cfg, StagedDataset.from_dict(self.staged))


def pick(operator: Any, cfg: Any, staged: Any, context: Any) -> dict[str, Any]:
    """``train`` after a sweep: the best trial's run as the run's trained model; its
    frozen config handed on to the steps after (XCom ``config``). A sweep with nothing to
    go on with fails the task without retries (its trials have ended: a retry would pick
    the same), its message the pick's line naming each failed trial."""
    from airflow.sdk.exceptions import AirflowFailException

    from training.config import frozen
    from training.errors import SweepRefused
    from training.steps import sweep

    try:
        chosen = sweep.pick(cfg, staged)
    except SweepRefused as exc:
        raise AirflowFailException(str(exc)) from exc
    handed = frozen.freeze(chosen)
    context["ti"].xcom_push(key=CONFIG_XCOM, value=handed)
    operator.log.info("the sweep's pick: %s (its frozen config %s)", chosen.run_id,
                      handed["path"])
    return {"run_id": chosen.run_id, "run_dir": os.fspath(chosen.run_dir()),
            "picked_from_sweep": cfg.run_id}


class TrialOperator(Step):
    """One trial of the run's sweep (module doc); XCom: how it ended (slot, state,
    values, objective, run dir)."""

    template_fields = ("staged", "slot")
    ends_run_on_failure = False  # the sweep judges a failed trial (tracking.on_task_failure)
    imports = ("training.steps.sweep", "training.launch.command", "training_airflow.store")
    ui_color = "#ffe8cc"

    def __init__(self, *, staged: Any, slot: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.slot = staged, slot

    def work(self, cfg: Any, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

        from training.data.snapshot.staging import StagedDataset
        from training.steps import sweep

        slot = int(self.slot)
        context[LABEL] = f"t{slot}"
        from training.sweep.storage import storage_url
        from training.sweep.study import study_name

        # What a deferred Job's trigger needs to let the lane go if a person stops it.
        self.trial_lane = {"storage": storage_url(cfg), "study_name": study_name(cfg),
                           "run_id": cfg.run_id, "slot": slot}

        def announce(label: str) -> None:
            context[LABEL] = label

        def launch(trial_cfg: Any, flags: Any) -> None:
            if trial_cfg.runtime.launcher == "local":
                from training.config import frozen
                from training.errors import ConfigError

                try:
                    self.run_command(trial_cfg, "train", staged=self.staged,
                                     flags=tuple(flags),
                                     config=frozen.freeze(trial_cfg)["path"])
                except AirflowFailException as exc:  # run_command's, for exit 2: the
                    if isinstance(exc.__cause__, ConfigError):  # trial's values refused
                        raise exc.__cause__ from None  # (run_trial records it)
                    raise
                return
            from training_airflow.launchers import LAUNCHERS

            LAUNCHERS[trial_cfg.runtime.launcher](self, trial_cfg, context)

        def wait_for_lane(opened: Any) -> None:  # every lane taken: wait in the triggerer
            from training_airflow.lane_trigger import LaneTrigger

            self.defer(trigger=LaneTrigger(
                storage=opened.url, study_name=opened.study.study_name,
                run_id=opened.run_id, lanes=cfg.sweep.parallel, slot=slot,
                poll_interval=LANE_POLL_S), method_name="resume")

        try:
            return sweep.run_trial(cfg, StagedDataset.from_dict(self.staged), slot, launch,
                                   base_config=self.frozen["path"], lanes=True,
                                   announce=announce,
                                   on_full=wait_for_lane if self.deferrable else None,
                                   passes=(TaskDeferred,))
        except sweep.TrialFailed as exc:
            raise AirflowFailException(str(exc)) from exc

