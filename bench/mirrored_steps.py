"""Benchmark 9: MirroredStrategy on 2 logical CPUs, automatic steps_per_execution vs 1.

The product's ``train`` (``training.train.fit``) with ``strategy=mirrored`` over
``/cpu:0`` and ``/cpu:1`` (this process's CPU split in two logical devices), mlp at
MNIST shape (``bench/training_speed.py``'s generated 54,000 training images, staged as
tfds shards), batch 64 per replica: ``steps_per_execution`` 0 (automatic: 10, which
needs ``training/train/keras_patches/steps_in_cond.py`` under this strategy) against 1, alternating,
``--reps`` times. Examples/s of the median steady-state epoch (epoch 2 on), wall and
per CPU-second, validation included.

Target: automatic >= 1.5x steps_per_execution 1 (wall).

    .venv/bin/python bench/mirrored_steps.py [--reps 2] [--epochs 3] [--staging-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

# Before anything starts TensorFlow's runtime: two logical CPU devices.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)

from _common import Report, median  # noqa: E402
from training_speed import BenchMnistShape, EpochClock, KerasClock  # noqa: E402

from training.config import DatasetConfig, RunConfig  # noqa: E402
from training.data.snapshot import staging  # noqa: E402
from training.train.fit import train  # noqa: E402


def run(staged, steps: int, epochs: int, workdir: str) -> EpochClock:
    cfg = RunConfig.from_flat({
        "dataset": staged.name, "model": "mlp", "epochs": epochs, "batch_size": 64,
        "strategy": "mirrored", "devices": ["/cpu:0", "/cpu:1"],
        "steps_per_execution": steps, "early_stopping_patience": 1000,
        "reduce_lr_patience": 1000, "backup_interval_s": 86_400.0,
        "staging_dir": staged.staging_dir, "output_dir": workdir,
    })
    clock = EpochClock()
    train(cfg, staged, extra_callbacks=[KerasClock(clock)])
    shutil.rmtree(workdir)
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--staging-dir")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-mirrored-")
    staged = staging.stage(DatasetConfig(
        name=f"{BenchMnistShape.name}/full",
        staging_dir=args.staging_dir or os.path.join(workdir, "datasets")))
    count = 54_000
    report = Report("MirroredStrategy on 2 logical CPUs: automatic steps_per_execution vs 1")
    clocks: dict[int, list[EpochClock]] = {0: [], 1: []}
    for rep in range(args.reps):
        for steps in clocks:
            clocks[steps].append(run(staged, steps, args.epochs,
                                     os.path.join(workdir, f"run-{steps}-{rep}")))
    speed = {steps: {kind: count / median([s for c in runs for s in getattr(c, kind)[1:]])
                     for kind in ("wall", "cpu")} for steps, runs in clocks.items()}
    auto = clocks[0][0].steps_per_execution
    for steps, label in ((0, f"automatic ({auto})"), (1, "1")):
        report.figure(f"mlp @ MNIST shape, mirrored over 2 CPU devices, steps_per_execution "
                      f"{label}: {speed[steps]['wall']:,.0f} ex/s wall, "
                      f"{speed[steps]['cpu']:,.0f} ex/s per CPU-s")
    ratio = speed[0]["wall"] / speed[1]["wall"]
    report.figure(f"per CPU-second: {speed[0]['cpu'] / speed[1]['cpu']:.2f}x")
    report.target("automatic steps_per_execution >= 1.5x 1 (wall)", ratio >= 1.5,
                  f"{ratio:.2f}x")
    shutil.rmtree(workdir, ignore_errors=True)
    report.finish()


if __name__ == "__main__":
    main()
