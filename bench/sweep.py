"""Benchmark 16: a sweep's speed (issue 41): pruning, overhead, concurrency.

Why: a sweep multiplies a night's training; the issue sets what the machinery around
the trials may cost. Every run here is ``python -m training run`` in a fresh output
directory and store, the digits dataset staged once before (a run not counted),
``--backup-interval-s 0 --min-accuracy 0``, ``--epochs``. A
``sitecustomize`` put on the PYTHONPATH of every process times, without changing the
product, each ``TrainingCommand.run`` (a trial's ``train`` child, spawn to exit), each
``training.steps.train.train`` (model, input, fit, save) and ``run_sweep`` (the sweep in
``run``: plan, trials, pick).

1. **Pruning**: the same sweep twice, ``--sweep-pruner median`` then ``none``: grid
   sampler (every learning rate once, in the seed's order), ``--trials`` 16, parallel 2,
   the same ``--sweep-seed`` and ``--run-id``, over learning rates half sensible (1e-3
   to 3e-2) and half hopeless (1e-7 to 1.5e-6: they train, finitely, to nothing; a rate
   large enough to explode risks a NaN, which fails the trial instead of pruning it).
   Once for each of ``--seeds`` (each seed another order of the same rates: which rates
   come first, before the pruner has completed trials to compare with, decides much of
   one sweep's saving). Trial-epochs: the sum of each trial's epochs done, from
   ``sweep.json``. Target: over the seeds, the median pruner saves >= 40% of them, and
   in each seed its best objective is within 0.005 of the unpruned sweep's.
2. **Overhead through the CLI**: a sweep of ``--overhead-trials`` sensible rates, one at
   a time, pruner none, against a plain run of each rate alone, ``--reps`` times
   alternating. A trial's own training is its child's wall time, spawn to exit
   (training plus the process start and imports, TensorFlow's included, which a plain
   run pays once too). Overhead a trial = (``run_sweep`` - its children) / trials: the
   study, planning, asking, telling, the objective read, the pick, ``sweep.json``.
   Target <= 2 s. Cross-check: (the sweep's wall - its children - a plain run's wall
   outside ``train.train``) / trials, an upper bound (a plain run imports Keras inside
   ``train.train``, the sweep's parent in its evaluation).
3. **Concurrency**: the first seed's pruning sweeps (parallel 2): each trial child's
   and each fit's start and end, and the seconds two ran at once.

Through Airflow, against its own floor for an empty mapped task: ``bench/sweep_airflow.py``.

    .venv/bin/python bench/sweep.py [--trials 16] [--epochs 8] [--seeds 0,1,2]
        [--overhead-trials 4] [--reps 2] [--only pruning|cli]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import PYTHON, Report, median

SENSIBLE = [1e-3, 3e-3, 1e-2, 3e-2, 1.5e-3, 5e-3, 2e-2, 2e-3]  # the first 4: the CLI's
HOPELESS = [1e-7, 2e-7, 5e-7, 1e-6, 1.5e-7, 3e-7, 7e-7, 1.5e-6]
SAVING, OBJECTIVE_GAP, CLI_LIMIT_S = 0.40, 0.005, 2.0
HOOK = '''"""bench/sweep.py's timer: trial children, fits, sweeps, to a JSON-lines file."""
import os
if os.environ.get("BENCH_SWEEP_TIMES"):
    import json, time
    from training.launch import command as _command, trials as _trials
    from training.steps import train as _train

    def _timed(fn, name):
        def timed(first, *args, **kwargs):
            start = time.time()
            try:
                return fn(first, *args, **kwargs)
            finally:
                with open(os.environ["BENCH_SWEEP_TIMES"], "a") as file:
                    file.write(json.dumps({"what": name(first), "run_id": first.run_id,
                                           "start": start, "end": time.time()}) + "\\n")
        return timed

    _command.TrainingCommand.run = _timed(_command.TrainingCommand.run,
                                          lambda cmd: "child " + cmd.command)
    _train.train = _timed(_train.train, lambda cfg: "fit")
    _trials.run_sweep = _timed(_trials.run_sweep, lambda cfg: "sweep")
'''
class Bench:
    def __init__(self, epochs: int) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
        (self.tmp / "hook").mkdir()
        (self.tmp / "hook" / "sitecustomize.py").write_text(HOOK)
        self.staging = self.tmp / "datasets"
        self.epochs = epochs
        self.count = 0

    def measured(self, measure: Callable[[], None], report: Report, keep: bool) -> None:
        """``measure()``; then the temporary directory removed (unless ``keep``), the
        wall and the load reported, and the report finished."""
        began = time.time()
        try:
            measure()
        finally:
            if keep:
                print(f"kept {self.tmp}")
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)
        report.figure(f"bench wall {time.time() - began:.0f} s, load {os.getloadavg()[0]:.1f}")
        report.finish()

    def env(self, times: Path) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.tmp / "hook"), "TF_CPP_MIN_LOG_LEVEL": "2",
                "BENCH_SWEEP_TIMES": str(times)}

    def run(self, *flags: str) -> dict:
        """One ``python -m training run`` in a fresh directory: wall, timer records, dir."""
        self.count += 1
        where = self.tmp / f"run-{self.count}"
        where.mkdir()
        times = where / "times.jsonl"
        args = [PYTHON, "-m", "training", "run", f"--staging-dir={self.staging}",
                f"--output-dir={where / 'runs'}", f"--store-uri={where / 'store'}",
                f"--epochs={self.epochs}", "--backup-interval-s=0", "--min-accuracy=0",
                *flags]
        with open(where / "stderr.log", "w") as err:
            start = time.time()
            done = subprocess.run(args, cwd=where, env=self.env(times), stdout=subprocess.PIPE,
                                  stderr=err, text=True)
            end = time.time()
        if done.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}; see {err.name}")
        records = [json.loads(line) for line in times.read_text().splitlines()] \
            if times.exists() else []
        return {"wall": end - start, "start": start, "records": records, "dir": where}


def sweep_flags(rates: list[float], trials: int, parallel: int, pruner: str, seed: int,
                run_id: str) -> list[str]:
    space = json.dumps({"fit.learning_rate": {"choices": rates}})
    return [f"--sweep-trials={trials}", f"--sweep-parallel={parallel}", "--sweep-sampler=grid",
            f"--sweep-pruner={pruner}", f"--sweep-seed={seed}", f"--sweep-space={space}",
            f"--run-id={run_id}"]


def slot_of(run_id: str) -> int:
    return int(run_id.rsplit("-t", 1)[1])


def spans(records: list[dict], what: str) -> dict[int, tuple[float, float]]:
    """Slot -> (start, end) of the trials' children (``child train``) or fits (``fit``)."""
    return {slot_of(r["run_id"]): (r["start"], r["end"]) for r in records
            if r["what"] == what and re.search(r"-t\d+$", r["run_id"])}


def overlap(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which at least two of ``intervals`` ran."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    alive, last, total = 0, 0.0, 0.0
    for at, step in events:
        if alive >= 2:
            total += at - last
        alive, last = alive + step, at
    return total


def sweep_json(run: dict) -> dict:
    found = list((run["dir"] / "runs").glob("*/model/sweep.json"))
    if len(found) != 1:
        raise RuntimeError(f"expected one sweep.json under {run['dir']}, found {found}")
    return json.loads(found[0].read_text())


def pruning(bench: Bench, report: Report, args: argparse.Namespace) -> None:
    half = args.trials // 2
    rates = SENSIBLE[: args.trials - half] + HOPELESS[:half]
    epochs: dict[str, int] = {"median": 0, "none": 0}
    gaps = []
    for seed in args.seeds:
        docs, runs = {}, {}
        for pruner in ("median", "none"):
            runs[pruner] = bench.run(*sweep_flags(rates, args.trials, 2, pruner, seed,
                                                  f"bench-prune-{seed}"))
            docs[pruner] = sweep_json(runs[pruner])
        done = {p: sum(len(t["epochs"]) for t in d["trials"]) for p, d in docs.items()}
        best = {p: d["best"]["value"] for p, d in docs.items()}
        for pruner, doc in docs.items():
            epochs[pruner] += done[pruner]
            trials = ", ".join(f"t{t['number']} lr {t['params']['fit.learning_rate']:g} "
                               f"{t['state']} {len(t['epochs'])}" for t in doc["trials"])
            report.figure(f"seed {seed}, pruner {pruner}: {done[pruner]} trial-epochs, best "
                          f"val_loss {best[pruner]:.4f} (t{doc['best']['number']}), wall "
                          f"{runs[pruner]['wall']:.1f} s; {trials}")
        gaps.append(abs(best["median"] - best["none"]))
        report.figure(f"seed {seed}: {done['median']} vs {done['none']} trial-epochs, "
                      f"{1 - done['median'] / done['none']:.0%} saved; best {best['median']:.4f}"
                      f" vs {best['none']:.4f}")
        if seed == args.seeds[0]:
            for pruner, run in runs.items():
                concurrency(report, pruner, run)
    saving = 1 - epochs["median"] / epochs["none"]
    report.target(f"median pruner saves >= {SAVING:.0%} of the trial-epochs over the seeds, "
                  f"each seed's best within {OBJECTIVE_GAP}",
                  saving >= SAVING and max(gaps) <= OBJECTIVE_GAP,
                  f"{epochs['median']} vs {epochs['none']} trial-epochs over seeds "
                  f"{', '.join(map(str, args.seeds))}: {saving:.0%} saved; largest best "
                  f"difference {max(gaps):.4f}")


def concurrency(report: Report, pruner: str, run: dict) -> None:
    children, fits = spans(run["records"], "child train"), spans(run["records"], "fit")
    zero = run["start"]
    shown = "; ".join(
        f"t{n} child +{s - zero:.1f}..+{e - zero:.1f} s"
        + (f" fit +{fits[n][0] - zero:.1f}..+{fits[n][1] - zero:.1f} s" if n in fits else "")
        for n, (s, e) in sorted(children.items()))
    both, fitting = overlap(list(children.values())), overlap(list(fits.values()))
    report.figure(f"concurrency, pruner {pruner}, parallel 2 (seconds from the command's "
                  f"start): {shown}")
    report.target(f"two trials overlap (pruner {pruner})", both > 0,
                  f"two children alive at once {both:.1f} s of {run['wall']:.1f} s; two "
                  f"fits at once {fitting:.1f} s")


def overhead_cli(bench: Bench, report: Report, args: argparse.Namespace) -> None:
    rates, n = SENSIBLE[: args.overhead_trials], args.overhead_trials
    per_trial, checks, startups, rows = [], [], [], []
    for rep in range(1, args.reps + 1):
        plain: dict[float, dict] = {}
        for contender in ["sweep", "plain"] if rep % 2 else ["plain", "sweep"]:
            if contender == "sweep":
                sweep = bench.run(*sweep_flags(rates, n, 1, "none", args.seed,
                                               f"bench-overhead-{rep}"))
            else:
                for rate in rates:
                    plain[rate] = bench.run(f"--learning-rate={rate}",
                                            f"--run-id=bench-plain-{rep}-{rate:g}")
        children, fits = spans(sweep["records"], "child train"), spans(sweep["records"], "fit")
        child_s = sum(e - s for s, e in children.values())
        (whole,) = [r["end"] - r["start"] for r in sweep["records"] if r["what"] == "sweep"]
        per_trial.append((whole - child_s) / n)
        fit = {rate: sum(r["end"] - r["start"] for r in p["records"] if r["what"] == "fit")
               for rate, p in plain.items()}
        outside = median([p["wall"] - fit[rate] for rate, p in plain.items()])
        checks.append((sweep["wall"] - child_s - outside) / n)
        startups.append(median([(children[k][1] - children[k][0])
                                - (fits[k][1] - fits[k][0]) for k in children]))
        for t in sweep_json(sweep)["trials"]:
            k, rate = t["number"], t["params"]["fit.learning_rate"]
            child, its_fit = children[k][1] - children[k][0], fits[k][1] - fits[k][0]
            rows.append(f"rep {rep} t{k} lr {rate:g}: trial child {child:.1f} s (its fit "
                        f"{its_fit:.1f} s); plain run "
                        f"{plain[rate]['wall']:.1f} s (its fit {fit[rate]:.1f} s)")
        plain_s = sum(p["wall"] for p in plain.values())
        report.figure(f"rep {rep}: `run` with a sweep of {n}, one at a time: {sweep['wall']:.1f} s"
                      ", "
                      f"of which the sweep (plan, trials, pick) {whole:.1f} s and its trial "
                      f"children {child_s:.1f} s -> {per_trial[-1]:.2f} s a trial beyond its "
                      f"child; plain runs of the same rates {plain_s:.1f} s, outside their fit "
                      f"{outside:.1f} s a run -> cross-check "
                      f"{checks[-1]:.2f} s a trial")
    for row in rows:
        report.figure("  " + row)
    report.figure(f"a trial child beyond its fit (process start, imports, TensorFlow, the staged "
                  f"data's check, the study opened for pruning, exit): median "
                  f"{median(startups):.1f} s a trial; a plain run pays its share once")
    report.target(f"CLI overhead a trial <= {CLI_LIMIT_S} s", median(per_trial) <= CLI_LIMIT_S,
                  f"median {median(per_trial):.2f} s ({', '.join(f'{v:.2f}' for v in per_trial)}"
                  f"; cross-check against the plain runs {median(checks):.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=16,
                        help=f"pruning sweeps' trials, 2 to {2 * len(HOPELESS)}")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=lambda text: [int(s) for s in text.split(",")],
                        default=[0, 1, 2], help="the pruning sweeps' --sweep-seed, each")
    parser.add_argument("--overhead-trials", type=int, default=4, help="<= 4")
    parser.add_argument("--reps", type=int, default=2, help="CLI overhead repetitions")
    parser.add_argument("--only", choices=("pruning", "cli"), help="one measure only")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    bench = Bench(args.epochs)
    report = Report("Sweep (issue 41): pruning, overhead beyond training, concurrency")

    def measure() -> None:
        bench.run("--run-id=bench-warmup")  # not counted: stages digits, warms the caches
        if args.only in (None, "pruning"):
            pruning(bench, report, args)
        if args.only in (None, "cli"):
            overhead_cli(bench, report, args)

    bench.measured(measure, report, keep=args.keep)

if __name__ == "__main__":
    main()
