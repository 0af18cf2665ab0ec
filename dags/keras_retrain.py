"""
### Nightly Keras retraining

Stages a dataset, trains a Keras model inside a `tf.distribute` strategy, evaluates it
against the model in production on the same test split, publishes it as an immutable
version and, if it wins, promotes it.

`stage_dataset -> validate_data -> plan_trials -> [trial] -> train -> evaluate ->
publish -> approve_promotion -> promote`

* With a **sweep** (`sweep_trials` above 0, docs/sweeps.md) the mapped `trial` task trains
  one trial per instance, at most `sweep_parallel` at once, each named by its values;
  `train` then picks the best completed trial, which goes on as the run's model. Without
  one, `plan_trials` plans nothing, `trial` has no instance (skipped) and `train` trains
  as always.

* `validate_data` **skips** the run (train and everything after it) when production was
  trained on the same data with the same settings (`force_train` trains anyway), and
  **fails** it before any training, with every reason, when the data fails a check
  (schema, examples per class, duplicates across splits, corrupt files, drift).

* **Scheduled** nightly (`TRAINING_SCHEDULE`, default `0 3 * * *`; empty for none) with the
  defaults below, **or** when labelled data lands: every event of the `labelled_data` Asset
  (`x-training://data/labelled`, from `land_labelled_data`) starts a run.
* **Manual**: *Trigger DAG* opens a form with every setting; Airflow rejects invalid values
  before the run exists.
* `promote` is **skipped** when the new model does not win; the reasons are in the
  `evaluate` task's log and XCom and in `evaluation.json` of the published version.
* `approve_promotion` asks a person (the UI's *Required actions*) only when the run's
  `require_approval` is on and the model won; a rejection or no answer within
  `approval_timeout_minutes` skips `promote` and is recorded in the promotion history.
* **Alerts** (docs/alerts.md): a failed task, a refused night, a promotion, a
  rejection, and a run not finished `TRAINING_DEADLINE_MINUTES` after it was queued.
* Assets: `training_staged_dataset` after staging, `training_production_model` after a
  promotion (schedule another DAG on it).
* `evaluate`, `publish` and `promote` link to their model version on the Models page
  (the task's "Model version" extra link).

Logic lives in the `training` library and `training_airflow` glue; this file only declares.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import (
    DAG,
    AssetOrTimeSchedule,
    AsyncCallback,
    CronTriggerTimetable,
    DeadlineAlert,
    DeadlineReference,
)

from training.deployment import deadline_from_env, retry_delay_from_env, schedule_from_env
from training_airflow import tracking
from training_airflow.alerts import on_task_failure
from training_airflow.approval import ApproveOperator
from training_airflow.assets import LABELLED_DATA, PRODUCTION_MODEL, STAGED_DATASET
from training_airflow.params import dag_params
from training_airflow.sweep_tasks import (
    MAP_INDEX_TEMPLATE,
    MAX_PARALLEL_TASKS,
    TRIGGER_RULE,
    PlanTrialsOperator,
    TrialOperator,
)
from training_airflow.tasks import (
    EvaluateOperator,
    PromoteOperator,
    PublishOperator,
    StageOperator,
    TrainOperator,
    ValidateOperator,
)

# On the cron OR on every landing of labelled data; on the landings only without a cron.
CRON = schedule_from_env()
SCHEDULE = (AssetOrTimeSchedule(timetable=CronTriggerTimetable(CRON, timezone="UTC"),
                                assets=LABELLED_DATA) if CRON else LABELLED_DATA)
# A run not finished this long after it was queued sends a "late" alert (the triggerer
# runs the callback: alerts.deadline_missed).
LATE = deadline_from_env()
DEADLINE = DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=LATE,
                         callback=AsyncCallback("training_airflow.alerts.deadline_missed"),
                         name="keras_retrain late") if LATE else None

with DAG(
    dag_id="keras_retrain",
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["training", "keras", "nightly"],
    doc_md=__doc__,
    params=dag_params(),
    deadline=DEADLINE,
    default_args={
        "owner": "ml-platform",
        "retries": 2,
        # TRAINING_RETRY_DELAY_SECONDS (60; the tests set seconds), then doubled per retry.
        "retry_delay": retry_delay_from_env(),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=30),
        "execution_timeout": timedelta(hours=1),
        # Once a task has finally failed (after its retries): one alert (alerts.py), and
        # the night's MLflow run ended FAILED (tracking.py; off without a tracking URI).
        "on_failure_callback": [on_task_failure, tracking.on_task_failure],
    },
) as dag:

    staged = StageOperator(task_id="stage_dataset", outlets=[STAGED_DATASET],
                           execution_timeout=timedelta(hours=2)).output
    validated = ValidateOperator(task_id="validate_data", staged=staged).output
    # A run with a sweep trains one mapped `trial` per trial (none without one: skipped),
    # and `train` then picks the best of them instead of training (sweep_tasks.py).
    slots = PlanTrialsOperator(task_id="plan_trials", staged=staged,
                               validated=validated).output
    trials = TrialOperator.partial(
        task_id="trial", staged=staged, execution_timeout=timedelta(hours=12),
        max_active_tis_per_dagrun=MAX_PARALLEL_TASKS, map_index_template=MAP_INDEX_TEMPLATE,
    ).expand(slot=slots)
    trained = TrainOperator(task_id="train", staged=staged, validated=validated,
                            trigger_rule=TRIGGER_RULE,
                            execution_timeout=timedelta(hours=12)).output
    trials >> trained.operator
    evaluation = EvaluateOperator(task_id="evaluate", staged=staged, trained=trained,
                                  validated=validated).output
    published = PublishOperator(task_id="publish", evaluation=evaluation).output
    # Asks a person only when the run requires it and the model won (approval.py).
    approval = ApproveOperator(task_id="approve_promotion", evaluation=evaluation,
                               published=published).output
    PromoteOperator(task_id="promote", published=published, approval=approval,
                    outlets=[PRODUCTION_MODEL], execution_timeout=timedelta(minutes=10))
