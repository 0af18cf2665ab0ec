"""Benchmark 6: orchestration overhead of Airflow.

A full ``airflow dags test keras_retrain`` run (a fresh project-local Airflow home,
SQLite, the digits dataset, the local store) vs the same work without Airflow: the
library's ``python -m training run`` (stage, train, evaluate, publish, promote in one
process) with the same settings, alternating, ``--reps`` times. Also prints each task's
duration from the Airflow run. Reported, no target.

    .venv/bin/python bench/orchestration.py [--reps 2] [--epochs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

from _common import PYTHON, ROOT, Report, median

AIRFLOW = os.path.join(os.path.dirname(PYTHON), "airflow")


def env_for(home: str) -> dict[str, str]:
    return {**os.environ, "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "TRAINING_DATA_DIR": os.path.join(home, "training"), "TF_CPP_MIN_LOG_LEVEL": "3"}


def airflow_run(conf: dict) -> tuple[float, dict[str, float]]:
    home = tempfile.mkdtemp(prefix="bench-orch-")
    env = env_for(home)
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True)
    start = time.perf_counter()
    subprocess.run([AIRFLOW, "dags", "test", "keras_retrain", "-c", json.dumps(conf)],
                   env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    code = ("import json\nfrom airflow.models import TaskInstance\n"
            "from airflow.utils.session import create_session\n"
            "with create_session() as s:\n"
            "    print(json.dumps({t.task_id: t.duration for t in s.query(TaskInstance)}))")
    out = subprocess.run([PYTHON, "-c", code], env=env, check=True, capture_output=True,
                         text=True).stdout
    return wall, json.loads(out.strip().splitlines()[-1])


def library_run(conf: dict) -> float:
    work = tempfile.mkdtemp(prefix="bench-lib-")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in conf.items()]
    start = time.perf_counter()
    subprocess.run([PYTHON, "-m", "training", "run", *args], cwd=work, check=True,
                   capture_output=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    conf = {"epochs": args.epochs, "min_accuracy": 0.5}
    report = Report("Orchestration overhead: airflow dags test vs the library alone")
    walls, libs, tasks = [], [], []
    for _ in range(args.reps):
        libs.append(library_run(conf))
        wall, durations = airflow_run(conf)
        walls.append(wall)
        tasks.append(durations)
    report.figure(f"library alone (python -m training run): median {median(libs):.1f} s; "
                  f"airflow dags test: median {median(walls):.1f} s; ratio "
                  f"{median(walls) / median(libs):.2f}; overhead "
                  f"{median(walls) - median(libs):.1f} s ({args.reps} reps, {args.epochs} "
                  "epochs)")
    names = sorted(tasks[0])
    per_task = ", ".join(f"{n} {median([t[n] for t in tasks]):.1f} s" for n in names)
    report.figure(f"task durations in the Airflow run: {per_task}; sum "
                  f"{median([sum(t.values()) for t in tasks]):.1f} s")
    report.finish()


if __name__ == "__main__":
    main()
