"""Benchmark 6: what Airflow costs around a run: ``./dev demo`` vs the library alone.

``./dev demo '{"force_train": true}'`` (the README's main command: the retraining DAG
once with ``airflow dags test``, then the summary) against ``python -m training run
--force-train`` (stage, validate, train, evaluate, publish, promote in one process) on
the same settings: the digits, the defaults, the same staging directory, store and
output directory (a temporary ``TRAINING_DATA_DIR``, so ``var/`` is left alone). With
the environment ready: one run of each first, not counted (it syncs nothing when
``.venv`` is current, migrates the database, stages the data), then the two alternate,
``--reps`` times. Both train every time (``force_train``) and evaluate against the
model the run before promoted. Also prints, from the demo's summary, each task's timing
line (queued, started, imports, work; ``training_airflow/records.py``).

Target: the demo <= 1.5x the library alone.

    .venv/bin/python bench/orchestration.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

from _common import PYTHON, ROOT, Report, median

DEMO_CONF = json.dumps({"force_train": True})


def demo(env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run([str(ROOT / "dev"), "demo", DEMO_CONF], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    return wall, json.loads(done.stdout)  # the summary, as JSON


def library(env: dict[str, str], data: str, rep: int) -> float:
    args = [f"--staging-dir={data}/datasets", f"--output-dir={data}/runs",
            f"--store-uri={data}/store", "--force-train", f"--run-id=library-{rep}"]
    start = time.perf_counter()
    subprocess.run([PYTHON, "-m", "training", "run", *args], cwd=data, env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    data = tempfile.mkdtemp(prefix="bench-orchestration-")
    env = {**os.environ, "TRAINING_DATA_DIR": data, "TF_CPP_MIN_LOG_LEVEL": "2"}
    report = Report("Orchestration: ./dev demo vs python -m training run")
    demo(env)  # warm-up: set-up checks, database, staging, a model in production
    library(env, data, 0)
    demos, libraries, timings = [], [], []
    for rep in range(1, args.reps + 1):
        libraries.append(library(env, data, rep))
        wall, summary = demo(env)
        assert summary["state"] == "success", summary
        demos.append(wall)
        timings.append(summary["timing"])
    ratio = median(demos) / median(libraries)
    report.figure(f"python -m training run --force-train: median {median(libraries):.1f} s; "
                  f"./dev demo '{DEMO_CONF}': median {median(demos):.1f} s; overhead "
                  f"{median(demos) - median(libraries):.1f} s ({args.reps} reps, defaults: "
                  "digits, mlp, 30 epochs)")
    for task in timings[0]:
        parts = {k: median([t[task][k] or 0.0 for t in timings]) for k in timings[0][task]}
        report.figure(f"  {task}: " + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s"
                                                 for k, v in parts.items()))
    report.target("./dev demo <= 1.5x python -m training run", ratio <= 1.5, f"{ratio:.2f}")
    report.finish()


if __name__ == "__main__":
    main()
