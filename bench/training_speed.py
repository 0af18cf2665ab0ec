"""Benchmarks 2 and 3: training throughput and time to accuracy, ours vs the seed.

The seed-style script feeds numpy arrays straight into ``model.fit`` (same model,
batch, epochs, optimizer, seed, the same digits split). Ours is the ``train`` stage
(``training.train.fit.train``: staged tfds dataset, cache, seeded shuffle, prefetch, the
strategy scope and every callback), in variants of the options that can make it faster.
Everything runs in this one process, the pairs alternating, ``--reps`` times.

* throughput: training examples per second over the steady-state epochs (epoch 2 on;
  the median epoch), target ours/seed >= 1.0 for mlp and cnn (aim: 1.5);
* time to accuracy: training wall time until the test accuracy reaches 0.95 (the test
  evaluation at each epoch end is not counted), ours vs seed.

    .venv/bin/python bench/training_speed.py [--reps 3] [--epochs 8]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _common import Report, median  # noqa: E402

VARIANTS = {
    "defaults": {},  # steps_per_execution auto: 10 on one device
    "steps_per_execution=1": {"steps_per_execution": 1},
    "jit_compile": {"jit_compile": True},
}


def make_timer(test_x, test_y, target=0.95):
    import keras
    import numpy as np

    class Timer(keras.callbacks.Callback):
        """Epoch times, and training time until test accuracy >= target."""

        def on_train_begin(self, logs=None):
            self.epoch_times, self.training_time, self.time_to_target = [], 0.0, None

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            elapsed = time.perf_counter() - self.start
            self.epoch_times.append(elapsed)
            self.training_time += elapsed
            if self.time_to_target is None:
                probs = self.model.predict(test_x, batch_size=512, verbose=0)
                if float(np.mean(probs.argmax(axis=1) == test_y)) >= target:
                    self.time_to_target = self.training_time

    return Timer()


def digits_arrays():
    import numpy as np
    from sklearn.datasets import load_digits

    from training.data.digits import split_indices

    digits = load_digits()
    x = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    y = digits.target.astype(np.int64)
    return {name: (x[idx], y[idx]) for name, idx in split_indices(len(y)).items()}


def seed_style(model_name, arrays, epochs, batch, timer):
    import keras

    from training.train import models

    keras.utils.set_random_seed(42)
    (x, y), (vx, vy) = arrays["train"], arrays["validation"]
    model = models.build(model_name, x.shape[1:], 10)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=batch, epochs=epochs, validation_data=(vx, vy),
              callbacks=[timer], verbose=0)


def ours(model_name, staged, epochs, batch, options, timer, workdir):
    from training.config import RunConfig
    from training.train.fit import train

    cfg = RunConfig.from_flat({
        "model": model_name, "epochs": epochs, "batch_size": batch,
        "early_stopping_patience": 1000, "reduce_lr_patience": 1000,
        "staging_dir": staged.staging_dir, "output_dir": workdir, "strategy": "one_device",
        **options,
    })
    train(cfg, staged, extra_callbacks=[timer])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--models", nargs="*", default=["mlp", "cnn"])
    args = parser.parse_args()

    from training.config import DatasetConfig
    from training.data import staging

    report = Report("Training throughput and time to accuracy (digits)")
    workdir = tempfile.mkdtemp(prefix="bench-train-")
    staged = staging.stage(DatasetConfig(staging_dir=os.path.join(workdir, "datasets")))
    arrays = digits_arrays()
    n_train = len(arrays["train"][1])
    test_x, test_y = arrays["test"]
    for model_name in args.models:
        speed = {name: [] for name in ["seed", *VARIANTS]}
        to_target = {name: [] for name in ["seed", *VARIANTS]}
        for rep in range(args.reps):
            timer = make_timer(test_x, test_y)
            seed_style(model_name, arrays, args.epochs, args.batch, timer)
            speed["seed"].append(n_train / median(timer.epoch_times[1:]))
            to_target["seed"].append(timer.time_to_target)
            for name, options in VARIANTS.items():
                timer = make_timer(test_x, test_y)
                run_dir = os.path.join(workdir, f"{model_name}-{name}-{rep}")
                ours(model_name, staged, args.epochs, args.batch, options, timer, run_dir)
                speed[name].append(n_train / median(timer.epoch_times[1:]))
                to_target[name].append(timer.time_to_target)
        seed_speed = median(speed["seed"])
        report.figure(f"{model_name}: seed-style numpy fit: {seed_speed:,.0f} examples/s")
        for name in VARIANTS:
            ratio = median(speed[name]) / seed_speed
            report.figure(f"{model_name}: ours ({name}): {median(speed[name]):,.0f} examples/s,"
                          f" ratio {ratio:.2f}")
        for name in ["seed", *VARIANTS]:
            reached = [t for t in to_target[name] if t is not None]
            text = (f"{median(reached):.2f} s ({len(reached)}/{args.reps} runs reached it)"
                    if reached else f"not reached in {args.epochs} epochs")
            report.figure(f"{model_name}: time to test accuracy 0.95, {name}: {text}")
        ratio = median(speed["defaults"]) / seed_speed
        report.target(f"{model_name} throughput ours/seed >= 1.0 (defaults)", ratio >= 1.0,
                      f"{ratio:.2f}")
    report.finish()


if __name__ == "__main__":
    main()
