"""The project's own JAX training step on whatever accelerator JAX finds: proof that a
run trains there, and on which device.

Made for the GPU machine this project borrows at times (Python 3.12, JAX with its CUDA
plugin, no TensorFlow, nothing from a registry, 64 MiB carried per call;
docs/benchmarks.md has the one-call recipe). It needs only what a JAX training process
needs: ``jax``, ``numpy``, ``keras`` (+ ``namex``, ``optree``), ``pillow`` and the
project's pure-Python package. It

1. makes a synthetic staged dataset there, in the seed's CIFAR shape by default
   (``bench/synthetic_staged.py``: tfds's layout and the staging manifest, written
   without TensorFlow);
2. trains it with ``training.train.fit.train`` under ``runtime.backend: jax``: the
   distribution decided as in production (every local device of JAX's default platform;
   data parallel when there are several), the input pipeline, every callback, the
   backup; the SavedModel is not made (it is made from the ``.keras`` file where
   TensorFlow is, and this machine has none);
3. prints the devices JAX sees, what ``run.json`` recorded (kind, devices, platform,
   mesh, global batch), and each epoch's training images per second and validation
   accuracy.

    KERAS_BACKEND=jax python3 bench/jax_device.py [--model cnn] [--shape 32x32x3]
        [--train 20000] [--batch 64] [--epochs 4] [--precision auto]

The speed targets are issue 35's (``bench/accelerator.py``); this prints figures, it
asserts none.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's package
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--shape", default="32x32x3")
    parser.add_argument("--train", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--precision", default="auto")
    args = parser.parse_args(argv)

    from training import backend

    backend.use("jax")
    import jax
    import keras
    from synthetic_staged import write

    from training.config import RunConfig
    from training.train import fit

    shape = tuple(int(d) for d in args.shape.split("x"))
    print(f"jax {jax.__version__} on {jax.default_backend()}: "
          f"{[str(d) for d in jax.devices()]}; keras {keras.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="jax-device-") as tmp:
        started = time.perf_counter()
        staged = write(Path(tmp) / "datasets", "synthetic", shape, 10,
                       {"train": args.train, "validation": args.train // 10,
                        "test": args.train // 10})
        print(f"made {args.train} training images of {shape} in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        cfg = RunConfig.from_flat({
            "staging_dir": staged.staging_dir, "output_dir": str(Path(tmp) / "runs"),
            "backend": "jax", "model": args.model, "epochs": args.epochs,
            "batch_size": args.batch, "mixed_precision": args.precision,
            "early_stopping_patience": 100, "reduce_lr_patience": 100})
        timer = epoch_timer(args.train)
        # No TensorFlow here: the SavedModel is made where it is (publish's machine).
        fit.export_in_tensorflow = lambda *_: print(
            "SavedModel not made: no TensorFlow on this machine", flush=True)
        result = fit.train(cfg, staged, extra_callbacks=[timer])
        run = json.loads((Path(result.run_dir) / "model" / "run.json").read_text())
        print("trained:", json.dumps({"strategy": run["strategy"],
                                      "software": run["software"]}), flush=True)
        for line in timer.lines:
            print(line, flush=True)
    return 0


def epoch_timer(images: int):
    """A callback noting each epoch's training images per second (its training part,
    timed apart from validation) and its validation accuracy (Keras is imported only
    once the backend is chosen)."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_test_begin(self, logs=None):
            self.trained = time.perf_counter() - self.started

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            self.lines.append(
                f"epoch {epoch + 1}: {images / self.trained:,.0f} training images/s "
                f"({self.trained:.2f} s), val_accuracy {logs.get('val_accuracy', 0):.4f}")

    return EpochTimer()


if __name__ == "__main__":
    sys.exit(main())
