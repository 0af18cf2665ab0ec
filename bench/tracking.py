"""Benchmark 19: what MLflow tracking costs (issue 46), side by side in one run.

Why: tracking must never slow a night. With tracking on, MLflow is imported and every
call made by the tracker's own sender process, at a lower CPU priority
(``training/tracking/sender.py``); this measures what is left on the training path.

1. **The demo's train step**: ``python -m training train --staged FILE --evaluate`` (what
   the demo's ``train`` task runs), the digits mlp, ``--epochs``, with tracking off and
   on (the demo's local store, a SQLite file, fresh each time: the worst case, its
   tables made on first use), alternating, ``--reps`` times each, every run in a fresh
   output directory and store. Target: median on / median off <= 1.03.
2. **A trial's end to end**: ``python -m training run`` with a sweep of ``--trials``
   trials (one at a time, pruner none), off and on, alternating, ``--reps`` times each.
   Extra a trial = (median on - median off) / trials. Target <= 0.2 s.

The plain path for comparison (the floor of both): the same command with tracking off
is what the product did before issue 46 (tracking off imports no MLflow: a test checks).

    .venv/bin/python bench/tracking.py [--epochs 5] [--reps 3] [--trials 4]

On 2 cores one train step varies by about a second from run to run (7%), so a 3% target
needs medians of 4 or more.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _common import PYTHON, Report, median

TRAIN_TARGET, TRIAL_TARGET_S = 1.03, 0.2


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run([PYTHON, "-m", "training", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env})
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"training {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return took


def _tracking(on: bool, root: Path, n: int) -> dict[str, str]:
    env = {"TRAINING_MLFLOW_TRACKING_URI": "", "MLFLOW_TRACKING_URI": ""}
    if on:
        (root / f"mlflow-{n}").mkdir()
        env["TRAINING_MLFLOW_TRACKING_URI"] = f"sqlite:///{root}/mlflow-{n}/mlflow.db"
    return env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--trials", type=int, default=4)
    args = parser.parse_args()
    report = Report("Benchmark 19: MLflow tracking's cost (issue 46)")
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        root = Path(tmp)
        staging = root / "datasets"
        staged = root / "staged.json"
        done = subprocess.run([PYTHON, "-m", "training", "stage", "--staging-dir",
                               str(staging)], capture_output=True, text=True, cwd=root,
                              check=True)
        staged.write_text(next(line for line in done.stdout.splitlines()
                               if line.startswith('{"staged"')))
        common = ["--staging-dir", str(staging), "--epochs", str(args.epochs),
                  "--backup-interval-s", "0", "--min-accuracy", "0"]
        times: dict[str, list[float]] = {"train off": [], "train on": [],
                                         "sweep off": [], "sweep on": []}
        n = 0
        for rep in range(args.reps):
            for on in (False, True):
                n += 1
                mode = "on" if on else "off"
                out = root / f"run-{n}"
                times[f"train {mode}"].append(_cli(
                    ["train", "--staged", str(staged), "--evaluate", *common,
                     "--output-dir", str(out / "runs"), "--store-uri", str(out / "store"),
                     "--run-id", f"train-{n}"], _tracking(on, root, n), root))
                n += 1
                out = root / f"run-{n}"
                times[f"sweep {mode}"].append(_cli(
                    ["run", *common, "--output-dir", str(out / "runs"), "--store-uri",
                     str(out / "store"), "--run-id", f"sweep-{n}", "--sweep-trials",
                     str(args.trials), "--sweep-parallel", "1", "--sweep-pruner", "none",
                     "--sweep-space", json.dumps({"fit.learning_rate": {
                         "float": [0.001, 0.03], "log": True}})],
                    _tracking(on, root, n), root))
            report.figure(f"rep {rep + 1}: " + ", ".join(
                f"{k} {v[-1]:.1f} s" for k, v in times.items()))
    med = {k: median(v) for k, v in times.items()}
    ratio = med["train on"] / med["train off"]
    report.figure(f"train step: off {med['train off']:.2f} s, on {med['train on']:.2f} s "
                  f"(medians of {args.reps}): {ratio:.3f}x")
    extra = (med["sweep on"] - med["sweep off"]) / args.trials
    report.figure(f"sweep of {args.trials}: off {med['sweep off']:.2f} s, on "
                  f"{med['sweep on']:.2f} s: {extra:+.2f} s a trial")
    report.target("train step with tracking", ratio <= TRAIN_TARGET,
                  f"{ratio:.3f}x (target <= {TRAIN_TARGET})")
    report.target("a trial's extra time", extra <= TRIAL_TARGET_S,
                  f"{extra:+.2f} s (target <= {TRIAL_TARGET_S} s)")
    report.finish()


if __name__ == "__main__":
    main()
