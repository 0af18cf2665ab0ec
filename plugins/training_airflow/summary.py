"""``python -m training_airflow.summary``: what the latest run of the DAG did.

Prints, from the Airflow metadata database, the latest ``keras_retrain`` run's state,
the published version and its metrics, and the promotion decision with its reasons, or
why it did not train (``validate_data`` found nothing new).
The README's main command (``./dev demo``) ends with it.
"""

from __future__ import annotations

import json
import sys

DAG_ID = "keras_retrain"


def latest_run_summary(dag_id: str = DAG_ID) -> dict:
    from airflow.models import DagRun, TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from training_airflow.tasks import SKIP_XCOM

    with create_session() as session:
        run = (session.query(DagRun).filter(DagRun.dag_id == dag_id)
               .order_by(DagRun.run_after.desc()).first())
        if run is None:
            raise SystemExit(f"error: no run of {dag_id} in this Airflow home")
        states = {ti.task_id: str(ti.state) for ti in
                  session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id,
                                                     TaskInstance.run_id == run.run_id)}
        rows = session.query(XComModel).filter(XComModel.dag_id == dag_id,
                                               XComModel.run_id == run.run_id).all()
        xcoms = {x.task_id: x.value for x in rows if x.key == "return_value"}
        skipped = next((x.value for x in rows if x.key == SKIP_XCOM), None)
        published = xcoms.get("publish") or {}
        evaluation = xcoms.get("evaluate") or {}
        return {
            "run_id": run.run_id,
            "state": str(run.state),
            "tasks": states,
            "published_version": published.get("version"),
            "model_name": published.get("model_name"),
            "store_uri": published.get("store_uri"),
            "metrics": published.get("metrics"),
            "champion": evaluation.get("champion"),
            "promoted": states.get("promote") == "success",
            "decision": evaluation.get("decision"),
            "skipped_because": skipped,
        }


def main() -> int:
    summary = latest_run_summary()
    print(json.dumps(summary, indent=2))
    return 0 if summary["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
