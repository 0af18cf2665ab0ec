"""
### Nightly Keras retraining

Stages a dataset, trains a Keras model inside a `tf.distribute` strategy, evaluates it
against the model in production on the same test split, publishes it as an immutable
version and, if it wins, promotes it.

`stage_dataset -> validate_data -> train -> evaluate -> publish -> promote`

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
* Assets: `training_staged_dataset` after staging, `training_production_model` after a
  promotion (schedule another DAG on it).
* `evaluate`, `publish` and `promote` link to their model version on the Models page
  (the task's "Model version" extra link).

Logic lives in the `training` library and `training_airflow` glue; this file only declares.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable

from training.deployment import schedule_from_env
from training_airflow.assets import LABELLED_DATA, PRODUCTION_MODEL, STAGED_DATASET
from training_airflow.params import dag_params
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

with DAG(
    dag_id="keras_retrain",
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["training", "keras", "nightly"],
    doc_md=__doc__,
    params=dag_params(),
    default_args={
        "owner": "ml-platform",
        "retries": 2,
        "retry_delay": timedelta(minutes=1),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=30),
        "execution_timeout": timedelta(hours=1),
    },
) as dag:

    staged = StageOperator(task_id="stage_dataset", outlets=[STAGED_DATASET],
                           execution_timeout=timedelta(hours=2)).output
    validated = ValidateOperator(task_id="validate_data", staged=staged).output
    trained = TrainOperator(task_id="train", staged=staged, validated=validated,
                            execution_timeout=timedelta(hours=12)).output
    evaluation = EvaluateOperator(task_id="evaluate", staged=staged, trained=trained,
                                  validated=validated).output
    published = PublishOperator(task_id="publish", evaluation=evaluation).output
    PromoteOperator(task_id="promote", published=published, outlets=[PRODUCTION_MODEL],
                    execution_timeout=timedelta(minutes=10))
