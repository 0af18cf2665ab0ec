"""The sender process (training/tracking/sender.py, tracking_process.py): MLflow's calls
made by a process of its own, at nice 10, so the tracked process never imports MLflow and
MLflow's CPU is what training leaves; what MLflow did not get, and why, comes back; a
sender process that dies stops tracking at once.

Real MLflow on a SQLite store in a temporary directory; the tracked process is a real
subprocess (a fresh interpreter, so ``sys.modules`` says what it imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TRACKED = textwrap.dedent("""
    import json, logging, os, signal, sys, time
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from training.tracking import open_tracker
    tracker = open_tracker(sys.argv[1])
    tracker.log_metrics("m", "night-1", {"loss": 1.0}, step=0)
    if sys.argv[2] == "kill":  # the sender process dies before it makes the next calls
        tracker.flush()
        os.kill(tracker._process.process.pid, signal.SIGKILL)
        time.sleep(0.5)
    tracker.log_metrics("m", "night-1", {"loss": 0.5}, step=1)
    tracker.end("m", "night-1", "complete")
    flushed = tracker.flush(timeout_s=60)
    sender = tracker._process.process.pid
    try:
        nicer = os.getpriority(os.PRIO_PROCESS, sender) - os.getpriority(os.PRIO_PROCESS, 0)
    except ProcessLookupError:  # killed
        nicer = None
    print(json.dumps({"flushed": flushed,
                      "stopped": tracker.stopped, "missed": tracker.missed_since(0),
                      "nicer": nicer, "mlflow_here": sorted(m for m in sys.modules
                                            if m.split(".")[0] == "mlflow")}))
""")


def _tracked(uri: str, mode: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", TRACKED, uri, mode], capture_output=True,
                          text=True, timeout=180, env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_calls_are_made_in_order_by_another_process(tmp_path: Path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    said, _ = _tracked(uri, "plain")
    assert said["flushed"] and said["stopped"] is None and said["missed"] == [], said
    assert said["mlflow_here"] == [], "the tracked process imported MLflow"
    assert said["nicer"] == 10, said  # it takes the CPU the training leaves
    client = mlflow.MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("m").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["pipeline.run_id"] == "night-1"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5)]


def test_a_server_that_does_not_answer_is_said_in_the_tracked_process_log():
    import socket

    down = socket.socket()  # bound, never listening: the connection is refused
    down.bind(("127.0.0.1", 0))
    try:
        said, log = _tracked(f"http://127.0.0.1:{down.getsockname()[1]}", "plain")
    finally:
        down.close()
    assert said["flushed"] and said["stopped"].startswith("finding the run: "), said
    assert "warning: MLflow tracking stopped for this process (finding the run" in log, log
    assert any(m.startswith("ending the run: not sent, tracking had stopped")
               for m in said["missed"]), said


def test_a_killed_sender_process_stops_tracking_and_loses_no_wait(tmp_path: Path):
    said, log = _tracked(f"sqlite:///{tmp_path / 'mlflow.db'}", "kill")
    assert said["flushed"], said  # False had it waited out its 60 s for the lost calls
    assert said["stopped"].startswith("the MLflow sender process ended (exit -9)"), said
    assert "warning: MLflow tracking stopped for this process (the MLflow sender" in log, log
    assert said["missed"], said
