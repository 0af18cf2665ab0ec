"""Benchmark 6: orchestration against Airflow's own floor.

Three commands, in the demo's environment (``./dev``'s ``airflow_env``: Airflow home
``.airflow`` of the repository, its plugins, no examples, no deadline alert; a temporary
``TRAINING_DATA_DIR``, so ``var/`` is left alone), alternating (the order turned every
repetition), ``--reps`` times, after one run of each that is not counted (it migrates
the database, stages the data, puts a model in production):

- **demo**: ``./dev demo '{"force_train": true}'`` (the retraining DAG once with
  ``airflow dags test``, then the summary);
- **library**: ``python -m training run --force-train`` on the same settings (stage,
  validate, train, evaluate, publish, promote in one process);
- **floor**: ``airflow dags test`` of a DAG of six empty chained ``@task`` s, written
  into a temporary dags folder, in the same Airflow home: what Airflow itself spends
  to start, parse, run six tasks and stop.

What the demo spends beyond the library run, against the floor:
``(demo - library) / floor`` (medians). Target: <= 1.3. Also prints each task's
timing line (queued, started, imports, work; ``training_airflow/records.py``) from
the demo's summary.

Not measured here: on the production stack (``./dev stack``, CeleryExecutor) each
task's overhead <= 1.2x an empty task's on the same worker.

    .venv/bin/python bench/orchestration.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _common import PYTHON, ROOT, Report, median

DEMO_CONF = json.dumps({"force_train": True})
LIMIT = 1.3
FLOOR_DAG_ID = "bench_orchestration_floor"
FLOOR_DAG = f'''"""Six empty chained tasks: Airflow's floor (bench/orchestration.py)."""
import datetime as dt

from airflow.sdk import dag, task


@task
def empty():
    return None


@dag(dag_id="{FLOOR_DAG_ID}", schedule=None, catchup=False,
     start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
def floor():
    previous = None
    for number in range(1, 7):
        current = empty.override(task_id=f"empty_{{number}}")()
        if previous is not None:
            previous >> current
        previous = current


floor()
'''


def demo_env(data: str) -> dict[str, str]:
    """The environment ``./dev demo`` gives ``airflow dags test`` (``airflow_env``)."""
    return {**os.environ, "AIRFLOW_HOME": str(ROOT / ".airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "TRAINING_DATA_DIR": data,
            "TF_CPP_MIN_LOG_LEVEL": "2", "TRAINING_DEADLINE_MINUTES": ""}


def demo(env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run([str(ROOT / "dev"), "demo", DEMO_CONF], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    summary = json.loads(done.stdout)
    assert summary["state"] == "success", summary
    return wall, summary


def library(env: dict[str, str], data: str, run_id: str) -> float:
    args = [f"--staging-dir={data}/datasets", f"--output-dir={data}/runs",
            f"--store-uri={data}/store", "--force-train", f"--run-id={run_id}"]
    start = time.perf_counter()
    subprocess.run([PYTHON, "-m", "training", "run", *args], cwd=data, env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - start


def floor(env: dict[str, str], dags: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "airflow"), "dags", "test",
                           FLOOR_DAG_ID], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)})
    wall = time.perf_counter() - start
    log = done.stdout + done.stderr
    if done.returncode or log.count("[DAG TEST] end task task_id=empty_") != 6:
        raise RuntimeError(f"the floor DAG did not run its six tasks:\n{log[-3000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    data = tempfile.mkdtemp(prefix="bench-orchestration-")
    dags = Path(tempfile.mkdtemp(prefix="bench-orchestration-dags-"))
    (dags / "floor.py").write_text(FLOOR_DAG)
    env = demo_env(data)
    report = Report("Orchestration: ./dev demo beyond the library run, against Airflow's "
                    "floor (six empty tasks)")
    demo(env)  # not counted: set-up checks, database, staging, a model in production
    library(env, data, "library-0")
    floor(env, dags)
    runs: dict[str, list[float]] = {"demo": [], "library": [], "floor": []}
    timings = []
    contenders = list(runs)
    for rep in range(1, args.reps + 1):
        for name in contenders if rep % 2 else reversed(contenders):
            if name == "demo":
                wall, summary = demo(env)
                timings.append(summary["timing"])
            elif name == "library":
                wall = library(env, data, f"library-{rep}")
            else:
                wall = floor(env, dags)
            runs[name].append(wall)
        report.figure(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in runs.items()))
    demo_s, library_s, floor_s = (median(runs[k]) for k in ("demo", "library", "floor"))
    report.figure(f"./dev demo '{DEMO_CONF}': median {demo_s:.1f} s; python -m training run "
                  f"--force-train: {library_s:.1f} s; airflow dags test of six empty tasks: "
                  f"{floor_s:.1f} s ({args.reps} reps; defaults: digits, mlp, 30 epochs)")
    for task in timings[0]:
        parts = {k: median([t[task][k] or 0.0 for t in timings]) for k in timings[0][task]}
        report.figure(f"  {task}: " + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s"
                                                 for k, v in parts.items()))
    report.figure("production stack (./dev stack), each task's overhead against an empty "
                  "task's on the same worker: not measured here")
    ratio = (demo_s - library_s) / floor_s
    report.target(f"(demo - library) / floor <= {LIMIT}", ratio <= LIMIT,
                  f"{demo_s - library_s:.1f} s beyond the library vs {floor_s:.1f} s: "
                  f"{ratio:.2f}")
    report.finish()


if __name__ == "__main__":
    main()
