"""The tasks' records and the summary read from them (``training_airflow.records``,
``summary``): what ``./dev demo`` prints comes from these files, not Airflow's database.

The task instances here are the two attributes a record takes from Airflow's; the DAG
runs that write real records are ``tests/dags/test_dag_run.py``, the README journeys
and the system journey."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from tools.summary import latest_run_summary
from training_airflow import records

GRAPH = {"stage_dataset": ["evaluate", "train", "validate_data"],
         "validate_data": ["evaluate", "train"], "train": ["evaluate"],
         "evaluate": ["publish"], "publish": ["promote"], "promote": []}
T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def _ti(task_id, run_id="scheduled__2026-12-01T03:00:00+00:00", start=T0):
    return SimpleNamespace(task_id=task_id, dag_id="keras_retrain", run_id=run_id,
                           try_number=1, start_date=start)


def _run(run_after=T0):
    return SimpleNamespace(run_after=run_after, start_date=run_after)


def _write(run_dir, task_id, state, value=None, run_after=T0, dag_id="keras_retrain"):
    ti = _ti(task_id)
    ti.dag_id = dag_id
    timed = records.Timing(queued=0.5, started=1.0, imports=0.25)
    timed.finish()
    records.write(run_dir, ti, _run(run_after), GRAPH, state, value, timed)


def test_tasks_that_never_ran_take_the_state_airflow_gives_them(tmp_path):
    skipped = tmp_path / "skipped"
    _write(skipped, "stage_dataset", "success", {"key": "digits:1.0.0@ab"})
    _write(skipped, "validate_data", "skipped", "nothing new: production was trained on it")
    assert records.task_states(records.read_run(skipped)) == {
        "stage_dataset": "success", "validate_data": "skipped", "train": "skipped",
        "evaluate": "skipped", "publish": "skipped", "promote": "skipped"}

    failed = tmp_path / "failed"
    _write(failed, "stage_dataset", "success")
    _write(failed, "validate_data", "success")
    _write(failed, "train", "failed", "LaunchError: training exited with code 1")
    states = records.task_states(records.read_run(failed))
    assert [states[t] for t in ("train", "evaluate", "publish", "promote")] == [
        "failed", "upstream_failed", "upstream_failed", "upstream_failed"]


SWEEP_GRAPH = {"plan_trials": ["trial"], "trial": ["train"], "train": []}


def _write_mapped(run_dir, task_id, state, value=None, map_index=-1):
    ti = _ti(task_id)
    ti.map_index = map_index
    timed = records.Timing(queued=0.5, started=1.0, imports=0.25)
    timed.finish()
    records.write(run_dir, ti, _run(), SWEEP_GRAPH, state, value, timed)


def test_a_mapped_tasks_instances_keep_a_record_each_and_the_task_takes_the_worst(tmp_path):
    swept = tmp_path / "swept"
    _write_mapped(swept, "plan_trials", "success", [0, 1, 2])
    for index, state in enumerate(("success", "failed", "success")):
        _write_mapped(swept, "trial", state, {"slot": index}, map_index=index)
    _write_mapped(swept, "train", "success")
    read = records.read_run(swept)
    assert {k: r["value"] for k, r in read.items() if r["task_id"] == "trial"} == {
        "trial[0]": {"slot": 0}, "trial[1]": {"slot": 1}, "trial[2]": {"slot": 2}}
    states = records.task_states(read)
    assert states["trial"] == "failed" and states["trial[1]"] == "failed"
    assert states["trial[0]"] == "success" and states["train"] == "success"
    # Without a sweep there is nothing to map over: the task never ran, skipped.
    plain = tmp_path / "plain"
    _write_mapped(plain, "plan_trials", "success", [])
    _write_mapped(plain, "train", "success")
    assert records.task_states(records.read_run(plain))["trial"] == "skipped"


def test_the_summary_is_the_latest_run_of_the_dag_read_from_its_records(tmp_path):
    runs = tmp_path / "runs"
    old, new, other = runs / "old", runs / "new", runs / "other"
    _write(old, "stage_dataset", "success", run_after=T0)
    _write(old, "validate_data", "skipped", "nothing new: same snapshot", run_after=T0)
    later = T0 + timedelta(days=1)
    for task, value in [("stage_dataset", {}), ("validate_data", {}), ("train", {}),
                        ("evaluate", {"decision": {"promote": True}, "champion": None}),
                        ("publish", {"version": "v2", "model_name": "digits-mlp",
                                     "store_uri": "/store", "metrics": {"accuracy": 0.97}})]:
        _write(new, task, "success", value, run_after=later)
    _write(new, "promote", "skipped", "not promoted: below the minimum", run_after=later)
    _write(other, "stage_dataset", "success", run_after=later + timedelta(days=1),
           dag_id="another_dag")

    summary = latest_run_summary(env={"TRAINING_DATA_DIR": str(tmp_path)})
    assert summary["state"] == "success"
    assert summary["published_version"] == "v2" and summary["promoted"] is False
    assert summary["tasks"]["promote"] == "skipped" and summary["skipped_because"] is None
    assert summary["decision"] == {"promote": True}
    assert set(summary["timing"]) == set(GRAPH)
    assert summary["timing"]["train"]["imports_s"] == 0.25

    (new / "airflow" / "train.json").write_text("{torn")  # an unreadable record
    assert "train" not in records.read_run(new)


def test_the_summary_command_imports_no_airflow_and_says_when_there_is_no_run(tmp_path):
    code = ("import sys, runpy\nsys.argv = ['summary']\n"
            "try:\n    runpy.run_module('tools.summary', run_name='__main__')\n"
            "finally:\n    print('airflow' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"TRAINING_DATA_DIR": str(tmp_path), "PATH": "/usr/bin"})
    assert done.returncode != 0
    assert "error: no run of keras_retrain has left its records under" in done.stderr
    assert done.stderr.splitlines()[0] == "False", done.stderr  # airflow not imported


def test_the_timing_line_and_queued_from_the_upstream_records(tmp_path):
    _write(tmp_path, "stage_dataset", "success")
    ended = datetime.fromisoformat(records.read_run(tmp_path)["stage_dataset"]["ended"])
    ti = _ti("validate_data", start=ended + timedelta(seconds=2))
    timed = records.timing(tmp_path, ti, _run(), {"stage_dataset"},
                           ended + timedelta(seconds=5), imports=0.04)
    assert timed.line() == "timing: queued 2.0 s, started 3.0 s, imports 0.0 s, work follows"
    first = records.timing(tmp_path / "none", _ti("stage_dataset", start=T0 + timedelta(
        seconds=1.5)), _run(), set(), T0 + timedelta(seconds=2), imports=1.0)
    assert (first.queued, first.started) == (1.5, 0.5)
    first.work = 3.25
    assert first.line().endswith("imports 1.0 s, work 3.2 s")
    record = json.loads((tmp_path / "airflow" / "stage_dataset.json").read_text())
    assert record["heavy_modules"] == sorted(m for m in records.HEAVY if m in sys.modules)
