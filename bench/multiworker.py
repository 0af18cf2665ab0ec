"""Benchmark 7: multi-worker scaling on CPU, 1 vs 2 workers.

Trains the same config with ``--workers 1`` (one process) and ``--workers 2`` (the local
launcher, MultiWorkerMirroredStrategy over loopback), alternating, ``--reps`` times, and
reads each epoch's training time from Keras' per-epoch lines (steps x ms/step, the
chief's). Examples per second over the steady-state epochs (epoch 2 on), and the
scaling efficiency = (2-worker examples/s) / (2 x 1-worker examples/s). This machine
has 2 cores: two workers share them, so the efficiency says what the collective costs,
not what two machines would give. Reported, no target.

    .venv/bin/python bench/multiworker.py [--reps 2] [--epochs 5]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

from _common import PYTHON, Report, median

EPOCH_LINE = re.compile(r"^(?:\[worker 0\] )?(\d+)/\1 - .*? - (\d+(?:\.\d+)?)(ms|s)/step")
TRAIN_EXAMPLES = 1258  # digits train split


def run(workers: int, epochs: int, batch: int) -> float:
    work = tempfile.mkdtemp(prefix=f"bench-mw{workers}-")
    proc = subprocess.run(
        [PYTHON, "-m", "training", "train", f"--workers={workers}", f"--epochs={epochs}",
         f"--batch-size={batch}", "--early-stopping-patience=1000"],
        cwd=work, capture_output=True, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    epoch_seconds = []
    for line in (proc.stdout + proc.stderr).splitlines():
        match = EPOCH_LINE.match(line.strip())
        if match:
            steps, per_step, unit = int(match[1]), float(match[2]), match[3]
            epoch_seconds.append(steps * per_step / (1000 if unit == "ms" else 1))
    if len(epoch_seconds) < 2:
        raise RuntimeError("could not read epoch times:\n" + proc.stdout[-2000:])
    return TRAIN_EXAMPLES / median(epoch_seconds[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    report = Report("Multi-worker scaling on CPU: 1 vs 2 workers (digits, mlp)")
    one, two = [], []
    for _ in range(args.reps):
        one.append(run(1, args.epochs, args.batch))
        two.append(run(2, args.epochs, args.batch))
    efficiency = median(two) / (2 * median(one))
    report.figure(f"1 worker: {median(one):,.0f} examples/s; 2 workers: {median(two):,.0f} "
                  f"examples/s (global batch {2 * args.batch}); speed-up "
                  f"{median(two) / median(one):.2f}x, scaling efficiency {efficiency:.0%} "
                  f"({os.cpu_count()} cores shared by the workers, {args.reps} reps)")
    report.finish()


if __name__ == "__main__":
    main()
