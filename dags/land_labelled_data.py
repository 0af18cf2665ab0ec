"""
### Land labelled data

Copies one day's partition of labelled images, `<source_dir>/dt=YYYY-MM-DD/<label>/<file>`,
into the data store (`<data_uri>/dt=YYYY-MM-DD/...`, `_SUCCESS` written last) with
`training.data.sources.landing.land`, and records an event of the `labelled_data` Asset
(`x-training://data/labelled`) whose `extra` is `{"partition", "files", "data_uri"}`.
`keras_retrain` is scheduled on that Asset: every landing starts a retraining run.

* **Manual** (or from another system through the REST API); no schedule.
* Params: `partition` (empty: the day before the run's date, the last day that is over,
  as `keras_retrain` counts days), `source_dir` (default
  `TRAINING_INCOMING_DIR`), `data_uri` (default `TRAINING_DATA_URI`; a directory or
  `s3://bucket/prefix`, with the credentials of the `TRAINING_AWS_CONN_ID` connection).
* Landing the same content again is a no-op that still records an event; different
  content for a partition that has landed fails the task at once, without retries.

Logic lives in `training.data.sources.landing`; this file only declares. See docs/data-arrival.md.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from training.deployment import aws_conn_id_from_env, landing_from_env, retry_delay_from_env
from training_airflow.assets import LABELLED_DATA

INCOMING_DIR, DATA_URI = landing_from_env()

with DAG(
    dag_id="land_labelled_data",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["training", "data"],
    doc_md=__doc__,
    params={
        "partition": Param(None, type=["null", "string"], title="Partition",
                           description="The day to land, dt=YYYY-MM-DD (like dt=2026-11-28); "
                                       "empty: the day before the run's date (UTC)."),
        "source_dir": Param(INCOMING_DIR, type="string", minLength=1,
                            title="Source directory",
                            description="Directory holding <partition>/<label>/<image file>."),
        "data_uri": Param(DATA_URI, type="string", minLength=1, title="Data store",
                          description="Where partitions land: a directory or "
                                      "s3://bucket/prefix."),
    },
    default_args={
        "owner": "ml-platform",
        "retries": 2,
        # TRAINING_RETRY_DELAY_SECONDS (60; the tests set seconds), then doubled per retry.
        "retry_delay": retry_delay_from_env(),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=10),
        "execution_timeout": timedelta(minutes=30),
    },
) as dag:

    @task(outlets=[LABELLED_DATA])
    def land(params: dict, dag_run=None, outlet_events=None) -> dict:
        """Land the partition; the Asset event's extra says which one."""
        from airflow.sdk.exceptions import AirflowFailException

        from training.data.sources import landing
        from training.errors import ConfigError, DatasetError
        from training_airflow.store import s3_options

        # Empty: the last day that is over when the run starts (run_after: fixed per run).
        day = pendulum.instance(dag_run.run_after).in_timezone("UTC").subtract(days=1)
        partition = params["partition"] or f"dt={day:%Y-%m-%d}"
        try:
            result = landing.land(params["source_dir"], params["data_uri"], partition,
                                  store_options=s3_options(params["data_uri"],
                                                           aws_conn_id_from_env()))
        except (ConfigError, DatasetError) as exc:  # the input is wrong: no retry fixes it
            raise AirflowFailException(str(exc)) from exc
        outlet_events[LABELLED_DATA].extra = {key: result[key]
                                              for key in ("partition", "files", "data_uri")}
        return result

    land()
