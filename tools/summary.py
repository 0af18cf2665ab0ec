"""``python -m tools.summary``: what the latest run of the DAG did.

Prints the latest ``keras_retrain`` run's state, its tasks' states, the published
version and its metrics, the promotion decision with its reasons, or why it did not
train (``validate_data`` found nothing new). It reads what the run's tasks wrote into
its run directory (``records.py``), not Airflow's database: no Airflow import, a
fraction of a second. The README's main command (``./dev demo``) ends with it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from training.deployment import Deployment
from training.errors import ConfigError
from training_airflow import records

DAG_ID = "keras_retrain"


def latest_run_summary(dag_id: str = DAG_ID, env: Mapping[str, str] = os.environ) -> dict:
    try:
        output_dir = Path(Deployment.from_env(env).output_dir)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    run = records.latest_run(output_dir, dag_id)
    if run is None:
        raise SystemExit(f"error: no run of {dag_id} has left its records under {output_dir}")
    states = records.task_states(run)
    values = {task: r["value"] for task, r in run.items() if r["state"] == "success"}
    published = values.get("publish") or {}
    evaluation = values.get("evaluate") or {}
    validated = run.get("validate_data", {})
    failed = {"failed", "upstream_failed"} & set(states.values())
    return {
        "run_id": next(iter(run.values()))["airflow_run_id"],
        "state": "failed" if failed else "success",
        "tasks": states,
        "published_version": published.get("version"),
        "model_name": published.get("model_name"),
        "store_uri": published.get("store_uri"),
        "metrics": published.get("metrics"),
        "champion": evaluation.get("champion"),
        "promoted": states.get("promote") == "success",
        "decision": evaluation.get("decision"),
        "skipped_because": validated.get("value") if validated.get("state") == "skipped"
        else None,
        "timing": {task: r["timing"] for task, r in run.items()},
    }


def main() -> int:
    summary = latest_run_summary()
    print(json.dumps(summary, indent=2))
    return 0 if summary["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
