"""Before a step defers it asks the API server whether a triggerer runs, and says so in
the task log when none does (``training_airflow.triggerer_health``).

The answers are what Airflow 3.3's ``/api/v2/monitor/health`` returns
(``airflow.api.common.airflow_health``: the triggerer's status ``healthy``,
``unhealthy`` with its last heartbeat, or null when none ever ran), served by a real HTTP
server on 127.0.0.1. The same check against a real Airflow whose triggerer was killed is
``bench/deferral_faults.py`` (docs/benchmarks.md, 18).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from training_airflow.triggerer_health import (
    HEALTH_PATH,
    health_url,
    no_triggerer,
    say_if_no_triggerer,
)

BEAT = "2026-12-07T08:00:00+00:00"


@pytest.fixture
def api_server():
    """An HTTP server whose ``health`` (a dict) ``/api/v2/monitor/health`` answers."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(server.health).encode()
            self.send_response(200 if self.path == HEALTH_PATH else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.health = {}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _health(status, beat) -> dict:
    return {"metadatabase": {"status": "healthy"},
            "scheduler": {"status": "healthy", "latest_scheduler_heartbeat": BEAT},
            "triggerer": {"status": status, "latest_triggerer_heartbeat": beat},
            "dag_processor": {"status": "healthy", "latest_dag_processor_heartbeat": BEAT}}


def test_the_health_url_is_on_the_execution_apis_server(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
                       "http://airflow-api:8080/execution/")
    assert health_url() == "http://airflow-api:8080/api/v2/monitor/health"


@pytest.mark.parametrize(("status", "beat", "said"), [
    ("healthy", BEAT, None),
    ("unhealthy", BEAT, f"the triggerer unhealthy (last heartbeat: {BEAT})"),
    (None, None, "the triggerer never started (last heartbeat: none)"),
])
def test_a_triggerer_that_is_not_healthy_is_said_in_the_task_log(api_server, caplog, status,
                                                                 beat, said, monkeypatch):
    api_server.health = _health(status, beat)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
                       f"http://127.0.0.1:{api_server.server_address[1]}/execution/")
    log = logging.getLogger("test.triggerer")
    with caplog.at_level(logging.WARNING, logger="test.triggerer"):
        reason = say_if_no_triggerer(log)
    if said is None:
        assert reason is None and not caplog.records
        return
    assert reason.startswith("no triggerer is running") and said in reason, reason
    [record] = caplog.records
    assert said in record.getMessage()
    assert "TRAINING_DEFERRABLE=false" in record.getMessage()


def test_an_api_server_that_cannot_tell_says_nothing(api_server):
    with socket.socket() as closed:  # bound, never listening
        closed.bind(("127.0.0.1", 0))
        assert no_triggerer(f"http://127.0.0.1:{closed.getsockname()[1]}{HEALTH_PATH}") \
            is None
    port = api_server.server_address[1]
    assert no_triggerer(f"http://127.0.0.1:{port}/elsewhere") is None  # a 404
    api_server.health = ["not", "a", "health", "answer"]
    assert no_triggerer(f"http://127.0.0.1:{port}{HEALTH_PATH}") is None
    assert no_triggerer(None) is None
