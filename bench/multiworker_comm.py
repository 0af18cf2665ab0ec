"""Benchmark 10: multi-worker communication on CPU: all-reduce implementation, gradient
packing and the collective timeout (``tf.distribute.experimental.CommunicationOptions``,
``runtime.all_reduce`` / ``runtime.gradient_pack_mb`` / ``runtime.collective_timeout_s``).

For each configuration, 2 worker processes of this script (``--worker``) run on this
machine, each with a ``TF_CONFIG`` naming both on free 127.0.0.1 ports
(``training.train.cluster.build``), and build their strategy with the product's
``training.train.strategy.resolve`` (a MultiWorkerMirroredStrategy over loopback gRPC)
and the Keras 3 patches, as ``training.launch.worker`` does. Each worker:

1. **all-reduce time**: a ``tf.function`` running ``strategy.run`` of
   ``ReplicaContext.all_reduce(SUM, grads)``, the call Keras's optimizer makes, on
   tensors shaped like the trainable variables of the built-in ``mlp`` and ``cnn``
   (28x28x1 input) and of the ResNet50 backbone (94 MB: where packs of 4 and 32 MiB
   can matter). Each call chains 5 all-reduces (each on the last one's result), so the
   call's own dispatch hardly counts; ``--iters`` calls after 3 warm-up calls, the
   median per all-reduce (ResNet50: 1 per call, 3 calls after 1). Also a one-float
   all-reduce: the fixed cost of one collective (``latency``);
2. **bytes per step**: the trainable variables' sizes x dtype size, and the packs TF
   makes of them (``cross_device_utils.group_by_size``, what ``CollectiveAllReduce``
   calls);
3. **fit**: ``model.fit`` of the built-in model (default ``mlp``) on generated images
   (28x28x1 uint8, 10 classes, ``--examples`` per epoch, ``AutoShardPolicy.DATA``),
   batch ``--batch`` per replica, Adam, the automatic ``steps_per_execution`` (10), no
   validation; examples/s of the median epoch from epoch 2 on. TF's INFO line for the
   gradient all-reduce it traced (``Collective all_reduce tensors: N all_reduces, ...
   implementation = ..., num_packs = K``) is kept: it shows the options reached fit's
   gradients.

The 1-worker baseline is the same worker without ``TF_CONFIG`` (TF's default strategy,
what ``--workers 1`` runs). Scaling efficiency = 2-worker examples/s / (2 x 1-worker
examples/s). The two workers share this machine's cores, so that efficiency is mostly
the shared CPU; the projection for two machines is computed from the 1-worker step
time, the bytes per step and the measured per-collective latency (the formula is
printed). Reported, no target.

    .venv/bin/python bench/multiworker_comm.py [--configs default ring pack1 pack4 pack32
        no-timeout] [--reps 1] [--epochs 4] [--examples 12800] [--iters 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PYTHON, ROOT, Report, median

# name -> (runtime.all_reduce, runtime.gradient_pack_mb, runtime.collective_timeout_s)
CONFIGS = {
    "default": ("auto", 0, 1800),  # the product's defaults
    "ring": ("ring", 0, 1800),
    "pack1": ("auto", 1, 1800),
    "pack4": ("auto", 4, 1800),
    "pack32": ("auto", 32, 1800),
    "no-timeout": ("auto", 0, 0),
}
CHAIN = 5  # all-reduces per tf.function call, each on the previous one's result
# (ResNet50's 94 MB: 1 per call, 3 calls after 1 warm-up)
REFERENCE_MODELS = ("mlp", "cnn")  # their gradients are all-reduced whatever fit trains
BIG = ("resnet50", (32, 32, 3), {"image_size": 32})  # only its variables' shapes matter
LINKS_GBIT = (1, 10, 25)
GRADIENT_LINE = "Collective all_reduce tensors:"


# ---------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> None:
    """One worker (or, without TF_CONFIG, the 1-worker baseline): measure, write JSON."""
    import logging

    import tensorflow as tf

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith(GRADIENT_LINE) and message not in lines:
                lines.append(message)

    tf.get_logger().addHandler(Keep())
    tf.get_logger().setLevel(logging.INFO)

    import keras
    import numpy as np
    from tensorflow.python.distribute import cross_device_utils

    from training.config import RunConfig
    from training.train import cluster, keras_patches, models
    from training.train import strategy as st

    all_reduce, pack_mb, timeout = CONFIGS[args.config]
    multi = cluster.workers(cluster.current()) > 1
    if multi:
        keras_patches.enable()  # as training.launch.worker does, before the strategy exists
    cfg = RunConfig.from_flat({"model": args.model, "batch_size": args.batch,
                               "all_reduce": all_reduce, "gradient_pack_mb": pack_mb,
                               "collective_timeout_s": timeout})
    resolved = st.resolve(cfg)
    strategy = resolved.strategy
    keras_patches.install_for(strategy)
    options = getattr(strategy.extended, "_communication_options", None)
    result: dict = {"kind": resolved.kind, "replicas": resolved.replicas,
                    "options": str(options), "sets": {}}
    shape = tuple(int(n) for n in args.image.split("x"))

    def sizes(model: keras.Model) -> dict:
        tensors = [tf.ones(v.shape, v.dtype) for v in model.trainable_variables]
        nbytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
                     for v in model.trainable_variables)
        # CollectiveAllReduce reverses the gradients, then packs them (cross_device_ops.py)
        packs = len(cross_device_utils.group_by_size(
            list(reversed(tensors)), options.bytes_per_pack if options else 0))
        return {"tensors": tensors, "bytes": nbytes, "count": len(tensors), "packs": packs}

    if multi:
        def replica_step(values, chain):
            # identity places the values on the replica's device, as gradients are;
            # `chain` all-reduces in a row, each on the last one's result, per call
            values = [tf.identity(v) for v in values]
            for _ in range(chain):
                values = tf.distribute.get_replica_context().all_reduce("SUM", values)
            return values[0]

        @tf.function
        def all_reduce_step(values, chain):
            return strategy.run(replica_step, args=(values, chain))

        sets = {"latency": {"tensors": [tf.ones([1])], "bytes": 4, "count": 1, "packs": 1},
                args.model: sizes(models.build(args.model, shape, 10))}
        for name in REFERENCE_MODELS:
            if name != args.model:
                sets[name] = sizes(models.build(name, shape, 10))
        if not args.no_big:
            sets[BIG[0]] = sizes(models.build(BIG[0], BIG[1], 10, BIG[2]))
        for name, info in sets.items():
            values = info.pop("tensors")
            small = info["bytes"] < 20e6
            iters, chain = (args.iters, CHAIN) if small else (3, 1)
            for _ in range(3 if small else 1):
                np.asarray(all_reduce_step(values, chain))
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                np.asarray(all_reduce_step(values, chain))
                times.append((time.perf_counter() - start) / chain)
            result["sets"][name] = {**info, "seconds": median(times),
                                    "all_reduces": iters * chain}

    # fit, as training/train/fit.py compiles it (no validation, no callbacks of ours)
    rng = np.random.default_rng(42)
    images = rng.integers(0, 256, (args.examples, *shape), dtype=np.uint8)
    labels = rng.integers(0, 10, args.examples).astype(np.int64)
    data_options = tf.data.Options()
    data_options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA)
    data = (tf.data.Dataset.from_tensor_slices((images, labels)).with_options(data_options)
            .cache().batch(resolved.global_batch_size).prefetch(tf.data.AUTOTUNE))
    with strategy.scope():
        model = models.build(args.model, shape, 10)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=resolved.learning_rate),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      steps_per_execution=st.steps_per_execution(0, resolved.kind))
    result["fit_bytes"] = sizes(model)
    result["fit_bytes"].pop("tensors")
    epochs: list[dict] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = (time.perf_counter(), time.process_time())

        def on_epoch_end(self, epoch, logs=None):
            epochs.append({"wall": time.perf_counter() - self.start[0],
                           "cpu": time.process_time() - self.start[1]})

    lines.clear()  # from here on: what fit traces
    model.fit(data, epochs=args.epochs, verbose=0, callbacks=[Clock()])
    steps = -(-args.examples // resolved.global_batch_size)
    result.update(epochs=epochs, steps=steps, global_batch=resolved.global_batch_size,
                  gradient_lines=lines)
    index = cluster.task_index(cluster.current())
    Path(args.out, f"worker-{index}.json").write_text(json.dumps(result))


# ---------------------------------------------------------------------------- parent


def launch(config: str, workers: int, args: argparse.Namespace) -> dict:
    """Run ``workers`` worker processes of this script; the chief's result."""
    from training.launch.local import free_ports
    from training.train import cluster

    out = tempfile.mkdtemp(prefix=f"bench-mwc-{config}-{workers}-")
    command = [PYTHON, __file__, "--worker", "--config", config, "--out", out,
               "--model", args.model, "--image", args.image, "--batch", str(args.batch),
               "--epochs", str(args.epochs), "--examples", str(args.examples),
               "--iters", str(args.iters)] + (["--no-big"] if args.no_big else [])
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": os.fspath(ROOT),
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TF_CONFIG", None)
    hosts = [f"127.0.0.1:{port}" for port in free_ports(workers)] if workers > 1 else []
    procs = []
    for index in range(workers):
        worker_env = dict(env)
        if hosts:
            worker_env["TF_CONFIG"] = cluster.build(hosts, index)
        log = open(Path(out, f"worker-{index}.log"), "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(command, env=worker_env, stdout=log,
                                       stderr=subprocess.STDOUT, cwd=out), log))
    failed = []
    for index, (proc, log) in enumerate(procs):
        try:
            code = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.close()
        if code:
            failed.append(index)
    if failed:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
        tail = Path(out, f"worker-{failed[0]}.log").read_text()[-3000:]
        raise RuntimeError(f"{config}: worker {failed[0]} failed:\n{tail}")
    return json.loads(Path(out, "worker-0.json").read_text())


def examples_per_s(result: dict) -> tuple[float, float, float]:
    """Examples/s, seconds per step and CPU-seconds per step of the median steady epoch."""
    steady = result["epochs"][1:] or result["epochs"]
    wall = median([e["wall"] for e in steady])
    cpu = median([e["cpu"] for e in steady])
    return (result["steps"] * result["global_batch"] / wall, wall / result["steps"],
            cpu / result["steps"])


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--image", default="28x28x1")
    parser.add_argument("--batch", type=int, default=64, help="per replica")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--examples", type=int, default=12800, help="per epoch, global")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--no-big", action="store_true", help="skip the ResNet50 set")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    report = Report(f"Multi-worker communication on CPU, 2 local workers ({args.model} "
                    f"{args.image}, batch {args.batch} per replica)")
    start = time.perf_counter()
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() \
        else ["?"] * 3
    one: list[dict] = []
    two: dict[str, list[dict]] = {name: [] for name in args.configs}
    for _ in range(args.reps):
        one.append(launch("default", 1, args))
        for name in args.configs:
            two[name].append(launch(name, 2, args))
            print(f"  measured {name} ({time.perf_counter() - start:.0f} s)", file=sys.stderr,
                  flush=True)

    first = two[args.configs[0]][0]
    fit_bytes = first["fit_bytes"]
    report.figure(f"load average at start: {' '.join(load)}")
    report.figure(f"fit model {args.model} {args.image}: {fit_bytes['count']} trainable "
                  f"tensors, {mb(fit_bytes['bytes'])} of float32 gradients all-reduced per "
                  f"step; all-reduced for reference: "
                  + ", ".join(f"{name} {mb(info['bytes'])} in {info['count']} tensors"
                              for name, info in first["sets"].items()
                              if name not in ("latency", args.model)))

    one_eps, one_step, one_cpu = (median([examples_per_s(r)[i] for r in one])
                                  for i in range(3))
    report.figure(f"1 worker (default strategy): {one_eps:,.0f} examples/s, "
                  f"{one_step * 1e3:.1f} ms/step ({one_cpu * 1e3:.1f} CPU-ms/step)")
    report.figure("2 workers, per configuration (all-reduce: median call of a tf.function "
                  "all-reducing gradient-shaped tensors; fit: median steady epoch):")
    rows = {}
    for name in args.configs:
        results = two[name]
        sets = results[0]["sets"]

        def seconds(set_name: str, results: list[dict] = results) -> float:
            return median([r["sets"][set_name]["seconds"] for r in results])

        eps, step, cpu = (median([examples_per_s(r)[i] for r in results]) for i in range(3))
        efficiency = eps / (2 * one_eps)
        rows[name] = {"latency": seconds("latency"), "fit_ar": seconds(args.model),
                      "eps": eps, "step": step, "efficiency": efficiency,
                      "packs": sets[args.model]["packs"]}
        shown = [f"{set_name} {mb(info['bytes'])}/{info['packs']} pack(s) "
                 f"{seconds(set_name) * 1e3:.2f} ms"
                 for set_name, info in sets.items() if set_name != "latency"]
        gradient = "; ".join(line.split(": ", 1)[1] for line in results[0]["gradient_lines"]
                             if line.startswith(f"{GRADIENT_LINE} {fit_bytes['count']} ")
                             ) or "no line"
        report.figure(
            f"  {name:<10} {results[0]['options']}\n"
            f"             all-reduce: 1 float {rows[name]['latency'] * 1e3:.2f} ms; "
            + "; ".join(shown)
            + f"\n             fit: {eps:,.0f} examples/s, {step * 1e3:.2f} ms/step "
              f"({cpu * 1e3:.2f} CPU-ms/step of the chief), efficiency {efficiency:.0%}\n"
              f"             fit's gradient all-reduce as TF traced it: {gradient}")

    base = rows[args.configs[0]]
    best_name = max(rows, key=lambda n: rows[n]["eps"])
    best = rows[best_name]
    report.figure(f"efficiency before ({args.configs[0]}): {base['efficiency']:.0%} "
                  f"({base['eps']:,.0f} examples/s); after (best, {best_name}): "
                  f"{best['efficiency']:.0%} ({best['eps']:,.0f} examples/s)")

    # two machines: each worker has this machine's cores; the all-reduce goes on a link
    nbytes, packs, latency = fit_bytes["bytes"], base["packs"], base["latency"]
    n = 2
    report.figure(
        "two machines (projection): t_step = t_compute + t_allreduce, t_allreduce = packs "
        "x latency + bytes x 2(n-1)/n x 8 / link, efficiency = t_compute / t_step (no "
        "overlap: one pack starts after the last gradient)")
    report.figure(f"  t_compute = {one_step * 1e3:.1f} ms (1 worker, this machine), bytes = "
                  f"{mb(nbytes)}, packs = {packs}, latency = {latency * 1e3:.2f} ms "
                  f"(1-float all-reduce on loopback), n = {n}")
    loop_transfer = max(base["fit_ar"] - packs * latency, 0.0)
    for gbit in LINKS_GBIT:
        t_ar = packs * latency + nbytes * 2 * (n - 1) / n * 8 / (gbit * 1e9)
        eff = one_step / (one_step + t_ar)
        report.figure(f"  {gbit:>2} Gbit/s: t_allreduce {t_ar * 1e3:.2f} ms, efficiency "
                      f"{eff:.0%}, {2 * args.batch / (one_step + t_ar):,.0f} examples/s "
                      f"(2 x {args.batch} per step)")
    report.figure(f"  on loopback the same bytes took {base['fit_ar'] * 1e3:.2f} ms "
                  f"({loop_transfer * 1e3:.2f} ms beyond the latency: the floor of gRPC on "
                  f"these cores); measured here, two processes sharing "
                  f"{os.cpu_count()} cores: efficiency {base['efficiency']:.0%}")
    report.figure(f"reps {args.reps}, epochs {args.epochs} x {args.examples} examples, "
                  f"wall {time.perf_counter() - start:.0f} s; load average at the end: "
                  f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    report.finish()


if __name__ == "__main__":
    main()
