"""Benchmark 14: the project's own JAX train step against the card's ceiling for the same
model, batch and precision, on whatever JAX sees (issue 35's targets).

* **ours**: ``training.train.fit.train`` under ``backend: jax`` on a staged synthetic
  dataset of the seed's shapes (``bench/synthetic_staged.py``), every callback on;
  images/s of the training part of its median epoch (``callbacks.throughput``, timed
  apart from validation) and its step time;
* **ceiling**: the same model (``models.build``) and optimizer, its training split
  already on the device, each epoch one jitted ``jax.lax.scan`` of stateless train
  steps over a permutation drawn there: no host loop, no copies, no metrics, no
  validation.

Cases: the seed's CIFAR CNN (32x32x3) and MNIST MLP (28x28x1), at batch 64 and 1024, in
float32 and mixed_bfloat16; and ResNet-50 at 224x224 (batch 128, bf16) read uncached
from the staged shards against the same step with its split on the device
(``--resnet``; hours on a CPU). It prints images/s, the ratio and the step time per
case; the targets (0.9x, 0.8x, 0.95x, 0.9x of the ceiling) are judged on the GPU
machine, and on the CPU the ratios are only a sanity check. No assertion, no exit code
for a miss on the CPU.

    KERAS_BACKEND=jax .venv/bin/python bench/accelerator.py [--train 4096] [--epochs 4]
        [--cases cnn:64:float32 mlp:1024:mixed_bfloat16 ...] [--resnet]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"cnn": (32, 32, 3), "mlp": (28, 28, 1), "resnet50": (224, 224, 3)}
CASES = [f"{m}:{b}:{p}" for m in ("cnn", "mlp") for b in (64, 1024)
         for p in ("float32", "mixed_bfloat16")]


def ours(root: Path, model: str, batch: int, policy: str, train: int, epochs: int,
         cache: str = "auto") -> tuple[float, float, str]:
    """(images/s, step ms, where the split lived) of the median epoch of fit.train."""
    from synthetic_staged import write

    from training.config import RunConfig
    from training.train import fit

    staged = write(root / "datasets", f"bench_{model}", SHAPES[model], 10,
                   {"train": train, "validation": max(batch, train // 10),
                    "test": max(batch, train // 10)})
    cfg = RunConfig.from_flat({
        "staging_dir": staged.staging_dir, "output_dir": str(root / "runs"),
        "run_id": f"{model}-{batch}-{policy}-{cache}", "backend": "jax", "model": model,
        "epochs": epochs, "batch_size": batch, "mixed_precision": policy,
        "input_cache": cache, "early_stopping_patience": 100, "reduce_lr_patience": 100,
        "steps_per_execution": 32})
    fit.export_in_tensorflow = lambda *_: None  # timing the training, not the export
    result = fit.train(cfg, staged)
    run_dir = Path(result.run_dir) / "model"
    metrics = json.loads((run_dir / "history.json").read_text())["metrics"]
    where = json.loads((run_dir / "run.json").read_text())["input"]["train"]
    return (statistics.median(metrics["images_per_s"][1:] or metrics["images_per_s"]),
            statistics.median(metrics["step_ms"][1:] or metrics["step_ms"]), where)


def ceiling(model_name: str, batch: int, policy: str, train: int,
            epochs: int) -> tuple[float, float]:
    """(images/s, step ms) of the whole epoch as one jitted scan on the device."""
    import jax
    import keras
    import numpy as np
    from synthetic_staged import images

    from training.train import models

    keras.mixed_precision.set_global_policy(policy)
    keras.distribution.set_distribution(None)
    model = models.build(model_name, SHAPES[model_name], 10)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    x, y = images(train, SHAPES[model_name], 10, 0)
    x, y = jax.device_put(x), jax.device_put(y.astype(np.int32))
    steps = train // batch

    def step(state, rows):
        trainable, non_trainable, opt = state

        def loss(t):
            out, nt = model.stateless_call(t, non_trainable, x[rows], training=True)
            return loss_fn(y[rows], out), nt

        (value, non_trainable), grads = jax.value_and_grad(loss, has_aux=True)(trainable)
        trainable, opt = optimizer.stateless_apply(opt, grads, trainable)
        return (trainable, non_trainable, opt), value

    @jax.jit
    def epoch(state, key):
        order = jax.random.permutation(key, train)[:steps * batch].reshape(steps, batch)
        return jax.lax.scan(step, state, order)

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    times = []
    for e in range(epochs + 1):  # the first compiles
        started = time.perf_counter()
        state, losses = epoch(state, jax.random.key(e))
        losses.block_until_ready()
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times[1:])
    return steps * batch / seconds, 1000 * seconds / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=CASES)
    parser.add_argument("--train", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--resnet", action="store_true")
    args = parser.parse_args(argv)
    from training import backend

    backend.use("jax")
    import jax

    print(f"jax {jax.__version__} on {jax.default_backend()}: {jax.devices()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-accelerator-") as tmp:
        cases = [c.split(":") for c in args.cases]
        if args.resnet:
            cases.append(["resnet50", "128", "mixed_bfloat16", "none"])
        for model, batch, policy, *cache in cases:
            batch = int(batch)
            mine, mine_ms, where = ours(Path(tmp), model, batch, policy, args.train,
                                        args.epochs, *(cache or ["auto"]))
            best, best_ms = ceiling(model, batch, policy, args.train, args.epochs)
            rows.append((f"{model} batch {batch} {policy} ({where})", mine, best, mine_ms,
                         best_ms))
            print(f"{rows[-1][0]}: ours {mine:,.0f} img/s ({mine_ms:.2f} ms/step), ceiling "
                  f"{best:,.0f} img/s ({best_ms:.2f} ms/step): {mine / best:.2f}x",
                  flush=True)
    print("\ncase | ours img/s | ceiling img/s | ours / ceiling | ours ms/step")
    for name, mine, best, mine_ms, _ in rows:
        print(f"{name} | {mine:,.0f} | {best:,.0f} | {mine / best:.2f} | {mine_ms:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
