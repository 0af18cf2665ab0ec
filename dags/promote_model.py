"""
### Promote or roll back a model version, by hand

Moves a model's production pointer to the version you name, through the same checks as
every promotion (every file downloaded and verified, the model loaded safely, a
compare-and-swap against production), and records in the promotion history who
triggered it and why. The Models page's "promote this version" and "roll back to this
version" links open a form of the page's own, filled in for that version, which
triggers this DAG as you (Airflow 3.3's trigger form cannot be filled from a link).

Who may: whoever Airflow lets trigger this DAG. A model or version that does not exist,
a version whose files are corrupt, or an empty reason fails the run at once, saying
which; the pointer does not move.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from training_airflow.assets import PRODUCTION_MODEL

with DAG(
    dag_id="promote_model",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    # Only ever triggered by a person (or the Models page's form): nothing to hold back.
    is_paused_upon_creation=False,
    tags=["training", "models"],
    doc_md=__doc__,
    params={
        "model_name": Param("", type="string", minLength=1, title="Model",
                            description="A model in the store (the Models page lists them)."),
        "version": Param("", type="string", minLength=1, title="Version",
                         description="The version to put in production."),
        "action": Param("promote", type="string", enum=["promote", "rollback"],
                        title="Action", description="promote: a newer version; rollback: "
                                                    "an earlier one back."),
        "reason": Param("", type="string", minLength=1, title="Reason",
                        description="Why (recorded in the promotion history)."),
    },
    default_args={"owner": "ml-platform", "retries": 0,
                  "execution_timeout": timedelta(minutes=30)},
) as dag:

    @task(outlets=[PRODUCTION_MODEL])
    def move_production_pointer(params: dict, dag_run=None, run_id=None) -> dict:
        """Check the request against the store and move the pointer."""
        from training_airflow.manual_promotion import move_pointer

        return move_pointer(params, dag_run, run_id)

    move_production_pointer()
