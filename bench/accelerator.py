"""Benchmark 14: the project's own JAX train step against the card's ceiling for the same
model, batch and precision, on whatever JAX sees (issue 35's targets).

* **ours**: ``training.train.fit.train`` under ``backend: jax`` on a staged synthetic
  dataset of the seed's shapes (``bench/synthetic_staged.py``), every callback on;
  images/s of the training part of its median epoch (``callbacks.throughput``, timed
  apart from validation) and its step time;
* **ceiling**: the same model (``models.build``) and optimizer, its training split
  already on the device, stateless train steps over a permutation drawn there: no
  copies, no metrics, no validation; the fastest of three loop forms: the epoch one
  jitted ``jax.lax.scan`` (rolled), jitted scans of ``--steps`` steps unrolled, one
  jitted step per dispatch. On a GPU the rolled scan is the fastest; on a CPU it runs
  a convolution far slower than the others (docs/backends.md), so a ceiling of the
  rolled form alone would hide a slow path there.

Cases: the seed's CIFAR CNN (32x32x3) and MNIST MLP (28x28x1), at batch 64 and 1024, in
float32 and mixed_bfloat16; and ResNet-50 at 224x224 (batch 128, bf16) read uncached
(``input_cache: none``) from the staged PNG shards and from their decoded copy
(``dataset.decoded_copy``), against the same step with its split on the device
(``--resnet``; hours on a CPU). It prints images/s, the ratio and the step time per
case; the targets (0.9x, 0.8x, 0.95x, 0.9x of the ceiling) are judged on the GPU
machine, and on the CPU the ratios are only a sanity check. No assertion, no exit code
for a miss on the CPU.

``--input`` (also part of ``--resnet``) times the uncached input alone at 224x224, no
model: the training split's batches of 128 as Keras's JAX trainer takes them (the
``PyDataset``'s worker threads) and copied to the device, from PNG shards and from the
decoded copy, in images/s. That is the rate an uncached run can be fed at, to set
beside a model's ceiling (ResNet-50's: 5,893 img/s on an H200).

    KERAS_BACKEND=jax .venv/bin/python bench/accelerator.py [--train 4096] [--epochs 4]
        [--cases cnn:64:float32 mlp:1024:mixed_bfloat16 ...] [--steps 32] [--resnet]
        [--input]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"cnn": (32, 32, 3), "mlp": (28, 28, 1), "resnet50": (224, 224, 3)}
MODEL_ARGS = {"resnet50": {"image_size": 224}}  # the backbones' default resizes to 96
CASES = [f"{m}:{b}:{p}" for m in ("cnn", "mlp") for b in (64, 1024)
         for p in ("float32", "mixed_bfloat16")]


def staged_set(root: Path, model: str, batch: int, train: int) -> Any:
    """The synthetic staged dataset of ``model``'s shape (written once per size), with
    its decoded copy (``dataset.decoded_copy``)."""
    from synthetic_staged import write

    from training.data.input import decoded_copy
    from training.data.input.staged_arrays import StagedArrays
    from training.data.snapshot.splits import split_names

    name = f"bench_{model}_{train}_{batch}"
    path = root / "datasets" / name
    if name not in STAGED:
        STAGED[name] = write(root / "datasets", name, SHAPES[model], 10,
                             {"train": train, "validation": max(batch, train // 10),
                              "test": max(batch, train // 10)})
        splits = split_names(StagedArrays(STAGED[name]), 0.1).values()
        started = time.perf_counter()
        decoded_copy.ensure(Path(STAGED[name].path), splits)
        print(f"{name}: decoded copy written in {time.perf_counter() - started:.1f} s "
              f"under {path}", flush=True)
    return STAGED[name]


STAGED: dict[str, Any] = {}


def ours(root: Path, model: str, batch: int, policy: str, train: int, epochs: int,
         cache: str = "auto", decoded: bool = False,
         steps: int = 32) -> tuple[float, float, str]:
    """(images/s, step ms, where the split lived) of the median epoch of fit.train."""
    from training.config import RunConfig
    from training.train import fit

    staged = staged_set(root, model, batch, train)
    cfg = RunConfig.from_flat({
        "staging_dir": staged.staging_dir, "output_dir": str(root / "runs"),
        "run_id": f"{model}-{batch}-{policy}-{cache}-{'copy' if decoded else 'shards'}",
        "backend": "jax", "model": model, "epochs": epochs, "batch_size": batch,
        "mixed_precision": policy, "input_cache": cache, "decoded_copy": decoded,
        "model_args": MODEL_ARGS.get(model, {}),
        "early_stopping_patience": 100, "reduce_lr_patience": 100,
        "steps_per_execution": steps})
    fit.export_in_tensorflow = lambda *_: None  # timing the training, not the export
    result = fit.train(cfg, staged)
    run_dir = Path(result.run_dir) / "model"
    metrics = json.loads((run_dir / "history.json").read_text())["metrics"]
    where = json.loads((run_dir / "run.json").read_text())["input"]["train"]
    return (statistics.median(metrics["images_per_s"][1:] or metrics["images_per_s"]),
            statistics.median(metrics["step_ms"][1:] or metrics["step_ms"]), where)


FORMS = ("step", "unrolled", "rolled")  # the ceiling's loop forms, in the order tried


def ceiling(model_name: str, batch: int, policy: str, train: int, epochs: int,
            group: int) -> tuple[float, float, str, dict[str, str]]:
    """(images/s, step ms, form) of the fastest loop form of bare train steps on the
    device, and each form's rate: ``rolled`` (the whole epoch one jitted scan),
    ``unrolled`` (jitted scans of ``group`` steps, unrolled), ``step`` (one dispatch a
    step). A form whose probe of 2 steps runs at under a quarter of the best so far is
    not timed further (a rolled CNN on a CPU: seconds a step); its probe is shown."""
    import jax
    import keras
    import numpy as np
    from synthetic_staged import images

    from training.train import models

    keras.mixed_precision.set_global_policy(policy)
    keras.distribution.set_distribution(None)
    model = models.build(model_name, SHAPES[model_name], 10, MODEL_ARGS.get(model_name, {}))
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

    programs = {"rolled": jax.jit(lambda state, order: jax.lax.scan(step, state, order)),
                "unrolled": jax.jit(lambda state, order: jax.lax.scan(
                    step, state, order, unroll=True)),
                "step": jax.jit(step)}
    chunk = {"rolled": steps, "unrolled": group, "step": None}
    draw = jax.jit(lambda key: jax.random.permutation(key, train)[:steps * batch]
                   .reshape(steps, batch))

    def run(form, state, order, size):
        pieces = list(order) if size is None else [order[i:i + size]
                                                   for i in range(0, len(order), size)]
        jax.block_until_ready(pieces)
        started = time.perf_counter()
        for piece in pieces:
            state, _ = programs[form](state, piece)
        jax.block_until_ready(state)
        return state, time.perf_counter() - started

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    seconds, shown = {}, {}
    for form in FORMS:  # a probe of 2 steps first (its first run compiles)
        probe, size = draw(jax.random.key(0))[:2], None if form == "step" else 2
        state, _ = run(form, state, probe, size)
        state, took = run(form, state, probe, size)
        if seconds and took / len(probe) > 4 * min(seconds.values()):
            shown[form] = f"{len(probe) * batch / took:,.0f} (probe)"
            continue
        times = []
        for e in range(epochs + 1):  # the first compiles
            state, took = run(form, state, draw(jax.random.key(e)), chunk[form])
            times.append(took)
        seconds[form] = statistics.median(times[1:]) / steps
        shown[form] = f"{batch / seconds[form]:,.0f}"
    best = min(seconds, key=seconds.get)
    return batch / seconds[best], 1000 * seconds[best], best, shown


def fed(root: Path, batch: int, train: int, epochs: int, decoded: bool) -> float:
    """Images/s of the uncached 224x224 training input alone, batches copied to the
    device as Keras's JAX trainer takes them (its PyDataset adapter's worker threads)."""
    import jax
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    from training.data.input.choose import load_builder, make_dataset
    from training.data.snapshot.splits import split_names

    staged = staged_set(root, "resnet50", batch, train)
    builder = load_builder(staged)
    split = split_names(builder, 0.1)["train"]
    data = make_dataset(builder, split, global_batch_size=batch, shuffle=True, seed=0,
                        cache="none", decoded=decoded)
    adapter = PyDatasetAdapter(data, shuffle=False)
    rates = []
    for _ in range(epochs):
        started, images = time.perf_counter(), 0
        for x, _ in adapter.get_numpy_iterator():
            jax.device_put(x).block_until_ready()
            images += len(x)
        rates.append(images / (time.perf_counter() - started))
        adapter.on_epoch_end()
    return statistics.median(rates[1:] or rates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=CASES)
    parser.add_argument("--train", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--resnet", action="store_true")
    parser.add_argument("--input", action="store_true")
    parser.add_argument("--steps", type=int, default=32, help="ours' steps_per_execution "
                        "and the ceiling's unrolled group")
    args = parser.parse_args(argv)
    from training import backend

    backend.use("jax")
    import jax

    print(f"jax {jax.__version__} on {jax.default_backend()}: {jax.devices()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-accelerator-") as tmp:
        if args.input or args.resnet:
            for decoded in (False, True):
                rate = fed(Path(tmp), 128, args.train, args.epochs, decoded)
                print(f"input alone, 224x224, batch 128, uncached, "
                      f"{'decoded copy' if decoded else 'PNG shards'}: {rate:,.0f} img/s",
                      flush=True)
        cases = [c.split(":") for c in args.cases]
        if args.resnet:
            cases += [["resnet50", "128", "mixed_bfloat16", "none"],
                      ["resnet50", "128", "mixed_bfloat16", "none", "decoded"]]
        for model, batch, policy, *rest in cases:
            batch, cache = int(batch), (rest or ["auto"])[0]
            decoded = "decoded" in rest
            mine, mine_ms, where = ours(Path(tmp), model, batch, policy, args.train,
                                        args.epochs, cache, decoded, args.steps)
            best, best_ms, form, shown = ceiling(model, batch, policy, args.train,
                                                 args.epochs, args.steps)
            source = ", decoded copy" if decoded else ""
            rows.append((f"{model} batch {batch} {policy} ({where}{source})", mine, best,
                         mine_ms, form))
            print(f"{rows[-1][0]}: ours {mine:,.0f} img/s ({mine_ms:.2f} ms/step), ceiling "
                  f"{best:,.0f} img/s ({best_ms:.2f} ms/step, {form}; img/s by form: "
                  + ", ".join(f"{k} {v}" for k, v in shown.items())
                  + f"): {mine / best:.2f}x", flush=True)
    print("\ncase | ours img/s | ceiling img/s (form) | ours / ceiling | ours ms/step")
    for name, mine, best, mine_ms, form in rows:
        print(f"{name} | {mine:,.0f} | {best:,.0f} ({form}) | {mine / best:.2f} | "
              f"{mine_ms:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
