"""Warm start (``model.warm_start``) against a cold start on the next night's data:
epochs and wall time until the new model reaches production's test accuracy.

The data are the offline digits as a team's daily partitions of PNG files
(``training.data.sources.demo``, no drift day, landed by
``training.data.sources.landing``), staged as ``data_source`` images, 8x8x1:

1. **night 1**: the partitions up to day 1 are staged; a cold run trains there (the
   product's defaults: early stopping, learning-rate reductions) and is evaluated,
   published and promoted: production, in a local store;
2. **night 2**: the partitions up to day 2 (day 1 again, plus a new day) are staged;
   production's test accuracy on night 2's test split is the target (the champion's
   score ``evaluate`` would compare against);
3. per rep, alternating which goes first, two runs on night 2 with the same seed:
   **warm** (``warm_start`` true: the weights of production, read verified from the
   store) and **cold** (fresh weights), ``training.train.fit.train`` as the pipeline
   calls it, every callback on.

After every epoch each run's model is scored on night 2's test split
(``training.metrics.evaluate_model``, as ``evaluate`` scores); the scoring's own time is
left out. Reported per run: the first epoch whose test accuracy reaches production's
(a warm run starts at exactly production's, its weights being production's: this
counts the epochs of training after which it still, or again, does), the wall time
from the ``train`` call to that epoch's end (so a warm run pays for fetching and
checking production; how long the run took until training began is printed too), the
epochs early stopping let it run, and its best test accuracy.
Medians over reps and the warm/cold ratios are printed last. Reported, not asserted.

    .venv/bin/python bench/warm_start.py [--reps 3] [--epochs 30] [--days 3]
        [--model mlp] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
from _common import machine, median  # noqa: E402

from training.config import RunConfig  # noqa: E402
from training.data.input.choose import load_builder, make_dataset  # noqa: E402
from training.data.sources.demo import write_demo_partitions  # noqa: E402
from training.data.sources.landing import land  # noqa: E402
from training.layout import RUN, model_dir  # noqa: E402
from training.metrics import evaluate_model  # noqa: E402
from training.registry.versions import open_registry  # noqa: E402
from training.steps import evaluate, promote, publish, stage  # noqa: E402
from training.train.fit import train  # noqa: E402

START = "2026-11-28"  # the demo's first day
AT = "2026-12-01T03:00:00+00:00"


class TestAccuracy(keras.callbacks.Callback):
    """Test accuracy after every epoch, with the wall time since ``t0`` (set before the
    ``train`` call) less the time spent scoring."""

    def __init__(self, test) -> None:
        super().__init__()
        self.test, self.t0, self.scoring = test, time.perf_counter(), 0.0
        self.points: list[tuple[int, float, float]] = []  # (epoch, accuracy, seconds)
        self.began = 0.0

    def on_train_begin(self, logs=None):
        self.began = time.perf_counter() - self.t0  # building, and a warm start's fetch

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        accuracy = evaluate_model(self.model, self.test)["accuracy"]
        self.points.append((epoch + 1, accuracy, now - self.t0 - self.scoring))
        self.scoring += time.perf_counter() - now


def _day(n: int) -> str:
    from datetime import date, timedelta

    return (date.fromisoformat(START) + timedelta(days=n - 1)).isoformat()


def _run(base: dict, test, target: float, **flat) -> dict:
    cfg = RunConfig.from_flat({**base, **flat})
    staged = stage.stage(cfg)
    scores = TestAccuracy(test)
    train(cfg, staged, extra_callbacks=[scores])
    reached = next(((e, s) for e, a, s in scores.points if a >= target), (None, None))
    record = json.loads((model_dir(cfg.run_dir()) / RUN).read_text())["warm_start"]
    return {"epochs_to_target": reached[0], "seconds_to_target": reached[1],
            "epochs_run": len(scores.points), "best": max(a for _, a, _ in scores.points),
            "first": scores.points[0][1], "from": (record or {}).get("from_version"),
            "began": scores.began}


def _text(value: float | None, unit: str = "") -> str:
    """A figure with its unit ("1 epoch", "2.5 epochs", "1.2 s"), or "not reached"."""
    if value is None:
        return "not reached"
    if unit:
        return f"{value:.1f}{unit}"
    return f"{value:g} epoch{'' if value == 1 else 's'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30, help="maximum epochs per run")
    parser.add_argument("--days", type=int, default=3, help="demo days the digits span")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--keep", help="work in this directory and keep it")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-warm-start-"))
    try:
        written = write_demo_partitions(work / "incoming", start=START, days=args.days,
                                        drift_day=None)
        for day in written["partitions"]:  # landed as a team's partitions land
            land(work / "incoming", str(work / "labelled"), day["partition"])
        base = {"dataset": "bench_digits", "data_source": "images",
                "data_uri": str(work / "labelled"), "image_shape": "8x8x1",
                "staging_dir": str(work / "datasets"), "output_dir": str(work / "runs"),
                "store_uri": str(work / "store"), "model": args.model,
                "model_name": "bench-digits", "strategy": "one_device",
                "epochs": args.epochs, "min_accuracy": 0.0}
        lines = _measure(base, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n== warm start against cold on the next night ==  ({machine()})")
    for line in lines:
        print(line)
    print("reported, not asserted")


def _measure(base: dict, args: argparse.Namespace) -> list[str]:
    night1 = RunConfig.from_flat({**base, "data_until": _day(1), "run_id": "night-1"})
    staged1 = stage.stage(night1)
    start = time.perf_counter()
    train(night1, staged1)
    production_s = time.perf_counter() - start
    registry = open_registry(night1.storage.store_uri)
    evaluate.evaluate(night1, staged1, registry)
    publish.publish(night1, registry, created=AT)
    promote.promote(night1, registry, at=AT)

    night2 = RunConfig.from_flat({**base, "data_until": _day(2), "run_id": "probe"})
    staged2 = stage.stage(night2)
    test = make_dataset(load_builder(staged2), "test", global_batch_size=256,
                        shuffle=False, seed=0, cache="memory")
    with tempfile.TemporaryDirectory() as tmp:
        target = evaluate_model(registry.load_model(night1.model_name, "night-1", tmp),
                                test)["accuracy"]
    lines = [f"production: {args.model} trained cold on night 1 ({staged1.key}) in "
             f"{production_s:.1f} s; its test accuracy on night 2 ({staged2.key}): "
             f"{target:.4f} (the target)"]
    print(lines[0], flush=True)
    runs: dict[str, list[dict]] = {"warm": [], "cold": []}
    for rep in range(args.reps):
        for kind in (("warm", "cold") if rep % 2 == 0 else ("cold", "warm")):
            result = _run(base, test, target, data_until=_day(2), seed=42 + rep,
                          run_id=f"night-2-{kind}-{rep}", warm_start=kind == "warm")
            runs[kind].append(result)
            line = (f"rep {rep + 1} {kind}: production's accuracy after "
                    f"{_text(result['epochs_to_target'])}, "
                    f"{_text(result['seconds_to_target'], ' s')}; epoch 1 "
                    f"{result['first']:.4f}, best {result['best']:.4f}, "
                    f"{result['epochs_run']} epochs run; started from "
                    f"{result['from'] or 'fresh weights'}, its first step "
                    f"{result['began']:.2f} s after the train call")
            lines.append(line)
            print(line, flush=True)
    medians = {}
    for kind, results in runs.items():
        reached = [r for r in results if r["epochs_to_target"] is not None]
        epochs = median([r["epochs_to_target"] for r in reached]) if reached else None
        seconds = median([r["seconds_to_target"] for r in reached]) if reached else None
        medians[kind] = (epochs, seconds)
        lines.append(f"{kind}: median {_text(epochs)}, {_text(seconds, ' s')} to "
                     f"production's accuracy ({len(reached)} of {len(results)} runs reached "
                     f"it); median best {median([r['best'] for r in results]):.4f}, median "
                     f"{median([r['epochs_run'] for r in results]):g} epochs run, "
                     f"training began {median([r['began'] for r in results]):.2f} s after the "
                     "train call")
    (we, ws), (ce, cs) = medians["warm"], medians["cold"]
    if None not in (we, ws, ce, cs):
        lines.append(f"warm / cold: {we / ce:.2f}x the epochs, {ws / cs:.2f}x the wall time "
                     "to production's test accuracy")
    return lines


if __name__ == "__main__":
    main()
