"""System: the REST API of ``./dev airflow`` refuses an invalid conf before a run exists.

The stack is ``./dev airflow`` from a fresh copy (``conftest.py``); the browser journey,
which also reads runs, XCom and the store over REST beside the browser, is
``test_journey.py``. Here the requests are a script's or CI's: ``POST
/api/v2/dags/{dag_id}/dagRuns`` with a Bearer JWT, a conf and no logical date.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.slow

DAG_ID = "keras_retrain"


def trigger(stack: Any, conf: dict[str, Any]) -> tuple[int, Any]:
    """The trigger form's request: conf, no logical date, sent from the DAG's page."""
    return stack.call(
        "POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
        {"logical_date": None, "conf": conf, "note": "system test"},
        headers={"Referer": f"{stack.base_url}/dags/{DAG_ID}/trigger"},
    )


def run_count(stack: Any) -> int:
    return stack.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"]


@pytest.mark.parametrize("conf", [
    {"epochs": 0},
    {"model": "no-such-model"},
    {"batch_size": "big"},
], ids=["epochs-below-minimum", "unknown-model", "batch-size-not-integer"])
def test_invalid_conf_is_refused_before_a_run_exists(dev_airflow: Any, conf):
    stack = dev_airflow
    before = run_count(stack)
    status, answer = trigger(stack, conf)
    assert status == 400, answer
    key = next(iter(conf))
    assert key in json.dumps(answer), answer
    assert run_count(stack) == before
