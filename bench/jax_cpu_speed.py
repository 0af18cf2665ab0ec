"""Benchmark 15: the project's JAX training on a CPU against plain Keras ``fit`` on the
JAX backend, side by side (issue 40).

On a CPU device the project's JAX path once trained the seed's CIFAR CNN 16x slower
than plain Keras: its fused loop was a rolled ``jax.lax.scan``, and XLA's CPU backend
runs a convolution inside a loop's body far slower (``training.train.fused_steps``
now picks the loop's form per platform). This shows the path a user gets against what
Keras alone gives, in one run:

* **ours**: ``training.train.fit.train`` under ``backend: jax`` on a staged synthetic
  dataset of the model's shape (``bench/synthetic_staged.py``, written without
  TensorFlow), every callback on, automatic ``steps_per_execution``, the split kept on
  the device when it fits (as a user gets it);
* **keras spe N**: plain ``model.fit`` on the same decoded arrays (read from the same
  staged shards), the same model from ``models.build``, Adam 1e-3, batch, seed and
  validation data, ``shuffle=True``, compiled with ``steps_per_execution`` N (``1`` is
  Keras's default; ``10`` is what ours runs).

Each contender runs ``--reps`` times in this one process, alternating, the order turned
every rep. The figure is training images per second of the median steady-state epoch
(epoch 2 on, every rep pooled), timed on the training part of the epoch (validation
apart), in wall time and per CPU-second of this process. Target: ours >= 0.95x the
faster plain Keras contender, in wall time, for each model.

    .venv/bin/python bench/jax_cpu_speed.py [--models cnn mlp] [--train 1280]
        [--mlp-train 16384] [--epochs 3] [--reps 2] [--batch 64] [--keras-steps 1 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"cnn": (32, 32, 3), "mlp": (28, 28, 1)}
SEED = 42
LIMIT = 0.95  # ours / the faster plain Keras fit, wall time, every model


def epoch_clock() -> Any:
    """A callback noting each epoch's training part (to the start of validation): wall
    and CPU seconds, and the validation accuracy at its end."""
    import jax
    import keras

    class EpochClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.wall: list[float] = []
            self.cpu: list[float] = []
            self.accuracy = float("nan")
            self.started: tuple[float, float] | None = None

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter(), time.process_time()

        def on_test_begin(self, logs=None):
            if self.started is not None:  # validation of this epoch starts
                # JAX dispatches asynchronously: wait for the last train step
                jax.block_until_ready([v.value for v in self.model.variables])
                wall, cpu = self.started
                self.wall.append(time.perf_counter() - wall)
                self.cpu.append(time.process_time() - cpu)
                self.started = None

        def on_epoch_end(self, epoch, logs=None):
            self.accuracy = (logs or {}).get("val_accuracy", float("nan"))

    return EpochClock()


def ours(staged: Any, model: str, args: argparse.Namespace, out: Path) -> tuple[Any, str]:
    """``fit.train`` as a user runs it; its clock and the loop form it logged."""
    import logging

    from training.config import RunConfig
    from training.train import fit

    cfg = RunConfig.from_flat({
        "staging_dir": staged.staging_dir, "output_dir": str(out), "backend": "jax",
        "model": model, "epochs": args.epochs, "batch_size": args.batch, "seed": SEED,
        "mixed_precision": "float32", "early_stopping_patience": 1000,
        "reduce_lr_patience": 1000, "backup_interval_s": 86_400.0})
    fit.export_in_tensorflow = lambda *_: None  # the SavedModel needs TensorFlow
    forms: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            forms.append(record.getMessage())

    catch = Catch()
    logging.getLogger("training.train.fused_steps").addHandler(catch)
    logging.getLogger("training.train.fused_steps").setLevel(logging.INFO)
    try:
        clock = epoch_clock()
        fit.train(cfg, staged, extra_callbacks=[clock])
    finally:
        logging.getLogger("training.train.fused_steps").removeHandler(catch)
    return clock, forms[-1] if forms else "Keras's own loop (the split on the host)"


def plain(data: dict, model_name: str, steps: int, args: argparse.Namespace) -> Any:
    """Plain Keras ``fit`` on the JAX backend over the decoded arrays."""
    import keras

    from training.train import models

    keras.distribution.set_distribution(None)
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(SEED)
    (x, y), (vx, vy) = data["train"], data["validation"]
    model = models.build(model_name, x.shape[1:], 10)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  steps_per_execution=steps)
    clock = epoch_clock()
    model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=True,
              validation_data=(vx, vy), callbacks=[clock], verbose=0)
    return clock


def speed(clocks: list[Any], count: int) -> dict[str, float]:
    """Images/s of the median steady-state epoch (epoch 2 on, every rep), wall and CPU."""
    return {kind: count / statistics.median(
        [s for c in clocks for s in (getattr(c, kind)[1:] or getattr(c, kind))])
        for kind in ("wall", "cpu")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp"], choices=SHAPES)
    parser.add_argument("--train", type=int, default=1280, help="CNN training images")
    parser.add_argument("--mlp-train", type=int, default=16384)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--keras-steps", type=int, nargs="+", default=[1, 10])
    args = parser.parse_args(argv)

    from training import backend

    backend.use("jax")
    import jax
    from _common import Report
    from synthetic_staged import write

    from training.data.input.staged_arrays import StagedArrays

    report = Report(f"JAX on this CPU: ours against plain Keras fit ({args.reps} reps, "
                    f"{args.epochs} epochs, batch {args.batch})")
    report.figure(f"jax {jax.__version__} on {jax.default_backend()}: {jax.devices()}; "
                  "images/s of the training part of the median epoch, epoch 2 on")
    with tempfile.TemporaryDirectory(prefix="bench-jax-cpu-") as tmp:
        for model in args.models:
            count = args.train if model == "cnn" else args.mlp_train
            staged = write(Path(tmp) / "datasets", f"bench_{model}", SHAPES[model], 10,
                           {"train": count, "validation": max(args.batch, count // 10),
                            "test": max(args.batch, count // 10)})
            arrays = StagedArrays(staged)
            data = {split: arrays.arrays(split) for split in ("train", "validation")}
            names = ["ours", *(f"keras spe {n}" for n in args.keras_steps)]
            runs: dict[str, list[Any]] = {name: [] for name in names}
            form = ""
            for rep in range(args.reps):
                for name in names if rep % 2 == 0 else names[::-1]:
                    if name == "ours":
                        clock, form = ours(staged, model, args, Path(tmp) / f"{model}-{rep}")
                    else:
                        clock = plain(data, model, int(name.split()[-1]), args)
                    runs[name].append(clock)
                    print(f"{model} rep {rep + 1} {name}: " + ", ".join(
                        f"{count / s:,.0f}" for s in clock.wall) + " img/s", flush=True)
            rates = {name: speed(clocks, count) for name, clocks in runs.items()}
            report.figure(f"{model}: ours ran {form}")
            for name, rate in rates.items():
                accuracy = statistics.median(c.accuracy for c in runs[name])
                report.figure(f"{model} {name}: {rate['wall']:,.0f} img/s wall, "
                              f"{rate['cpu']:,.0f} per CPU-s, val_accuracy {accuracy:.3f}")
            for name in names[1:]:
                report.figure(f"{model}: ours / {name}: "
                              f"{rates['ours']['wall'] / rates[name]['wall']:.2f}x wall, "
                              f"{rates['ours']['cpu'] / rates[name]['cpu']:.2f}x per CPU-s")
            best = max(names[1:], key=lambda name: rates[name]["wall"])
            ratio = rates["ours"]["wall"] / rates[best]["wall"]
            report.target(f"{model}: ours >= {LIMIT}x the faster plain Keras fit",
                          ratio >= LIMIT, f"{ratio:.2f}x {best}, wall")
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
