"""Benchmark 16: a sweep's speed (issue 41): pruning, overhead, concurrency.

Why: a sweep multiplies a night's training; the issue sets what the machinery around
the trials may cost. Every run here is ``python -m training run`` (or ``airflow dags
test``) in a fresh output directory and store, the digits dataset staged once before
(a run not counted), ``--backup-interval-s 0 --min-accuracy 0``, ``--epochs``. A
``sitecustomize`` put on the PYTHONPATH of every process times, without changing the
product, each ``TrainingCommand.run`` (a trial's ``train`` child, spawn to exit), each
``training.steps.train.train`` (model, input, fit, save) and ``run_sweep`` (the sweep in
``run``: plan, trials, pick).

1. **Pruning**: the same sweep twice, ``--sweep-pruner median`` then ``none``: grid
   sampler (every learning rate once, in the seed's order), ``--trials`` 8, parallel 2,
   ``--sweep-seed``, the same ``--run-id``, over learning rates half sensible (1e-3 to
   3e-2) and half hopeless (1e-7 to 1e-6: they train, finitely, to nothing; a rate
   large enough to explode risks a NaN, which fails the trial instead of pruning it).
   Trial-epochs (the sum of each trial's epochs done, from ``sweep.json``). Target: the
   median pruner saves >= 40% of them, its best objective within 0.005 of the other's.
2. **Overhead through the CLI**: a sweep of ``--overhead-trials`` sensible rates, one at
   a time, pruner none, against a plain run of each rate alone, ``--reps`` times
   alternating. A trial's own training is its child's wall time, spawn to exit
   (training plus the process start and imports, TensorFlow's included, which a plain
   run pays once too). Overhead a trial = (``run_sweep`` - its children) / trials: the
   study, planning, asking, telling, the objective read, the pick, ``sweep.json``.
   Target <= 2 s. Cross-check: (the sweep's wall - its children - a plain run's wall
   outside ``train.train``) / trials, an upper bound (a plain run imports Keras inside
   ``train.train``, the sweep's parent in its evaluation).
3. **Overhead through Airflow**: ``airflow dags test keras_retrain`` with a sweep of
   ``--airflow-trials`` (parallel 1, pruner none) against ``airflow dags test`` of an
   empty task mapped over as many instances (then one empty task), in one temporary
   Airflow home (the demo's settings, as ``bench/orchestration.py``). An instance's cost
   is from its ``[DAG TEST] starting`` line to the next task's; the trial's minus its
   child. Target: median trial instance <= 1.3x median empty instance.
4. **Concurrency**: the pruning sweeps' trials (parallel 2): each child's and each fit's
   start and end, and the seconds two ran at once.

    .venv/bin/python bench/sweep.py [--trials 8] [--epochs 8] [--seed 0]
        [--overhead-trials 4] [--reps 2] [--airflow-trials 4] [--no-airflow]
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
from datetime import datetime
from pathlib import Path

from _common import PYTHON, ROOT, Report, median

SENSIBLE = [1e-3, 3e-3, 1e-2, 3e-2]
HOPELESS = [1e-7, 2e-7, 5e-7, 1e-6]
SAVING, OBJECTIVE_GAP, CLI_LIMIT_S, AIRFLOW_LIMIT = 0.40, 0.005, 2.0, 1.3
FLOOR_DAG_ID = "bench_sweep_floor"
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
FLOOR_DAG = '''"""An empty task mapped over {n} instances, then one: bench/sweep.py's floor."""
import datetime as dt

from airflow.sdk import dag, task


@task
def slots():
    return list(range({n}))


@task
def empty(slot):
    return None


@task
def after():
    return None


@dag(dag_id="{dag_id}", schedule=None, catchup=False,
     start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
def floor():
    empty.expand(slot=slots()) >> after()


floor()
'''
STARTING = re.compile(r"^(\S+) .*\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)")


class Bench:
    def __init__(self, epochs: int) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
        (self.tmp / "hook").mkdir()
        (self.tmp / "hook" / "sitecustomize.py").write_text(HOOK)
        self.staging = self.tmp / "datasets"
        self.epochs = epochs
        self.count = 0

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
    docs, runs = {}, {}
    for pruner in ("median", "none"):
        runs[pruner] = bench.run(*sweep_flags(rates, args.trials, 2, pruner, args.seed,
                                              "bench-prune"))
        docs[pruner] = sweep_json(runs[pruner])
    epochs = {p: sum(len(t["epochs"]) for t in d["trials"]) for p, d in docs.items()}
    best = {p: d["best"]["value"] for p, d in docs.items()}
    for pruner, doc in docs.items():
        trials = ", ".join(f"t{t['number']} lr {t['params']['fit.learning_rate']:g} "
                           f"{t['state']} {len(t['epochs'])}" for t in doc["trials"])
        report.figure(f"pruner {pruner}: {epochs[pruner]} trial-epochs, best val_loss "
                      f"{best[pruner]:.4f} (t{doc['best']['number']}), wall "
                      f"{runs[pruner]['wall']:.1f} s; {trials}")
    saving = 1 - epochs["median"] / epochs["none"]
    gap = abs(best["median"] - best["none"])
    report.target(f"median pruner saves >= {SAVING:.0%} of the trial-epochs, best within "
                  f"{OBJECTIVE_GAP}", saving >= SAVING and gap <= OBJECTIVE_GAP,
                  f"{epochs['median']} vs {epochs['none']} trial-epochs: {saving:.0%} saved; "
                  f"best {best['median']:.4f} vs {best['none']:.4f}, difference {gap:.4f}")
    for pruner, run in runs.items():
        concurrency(report, pruner, run)


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


def dag_test(env: dict[str, str], dag_id: str, conf: dict | None, log: Path) -> list[tuple]:
    """``airflow dags test``; the ``[DAG TEST] starting`` lines: (time, task, map index)."""
    command = [str(ROOT / ".venv" / "bin" / "airflow"), "dags", "test", dag_id]
    if conf is not None:
        command += ["-c", json.dumps(conf)]
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"airflow dags test {dag_id} exited {done.returncode}: see {log}")
    starts = []
    for line in log.read_text().splitlines():
        if m := STARTING.match(line):
            starts.append((datetime.fromisoformat(m[1]).timestamp(), m[2], int(m[3])))
    return starts


def instance_costs(starts: list[tuple], task: str) -> dict[int, float]:
    """Map index -> seconds from the instance's start to the next task's start."""
    return {index: starts[k + 1][0] - at for k, (at, name, index) in enumerate(starts[:-1])
            if name == task}


def overhead_airflow(bench: Bench, report: Report, args: argparse.Namespace) -> None:
    n, home = args.airflow_trials, bench.tmp / "airflow"
    dags = bench.tmp / "floor-dags"
    dags.mkdir()
    (dags / "floor.py").write_text(FLOOR_DAG.format(n=n, dag_id=FLOOR_DAG_ID))
    times = home / "times.jsonl"
    env = {**bench.env(times), "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER":
           str(ROOT / "dags"), "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "TRAINING_DATA_DIR": str(home / "data"),
           "TRAINING_DEADLINE_MINUTES": ""}
    home.mkdir()
    subprocess.run([str(ROOT / ".venv" / "bin" / "airflow"), "db", "migrate"], env=env,
                   cwd=ROOT, check=True, capture_output=True)
    floor_env = {**env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    floor = instance_costs(dag_test(floor_env, FLOOR_DAG_ID, None, home / "floor.log"), "empty")
    conf = {"epochs": args.epochs, "min_accuracy": 0, "backup_interval_s": 0,
            "sweep_trials": n, "sweep_parallel": 1, "sweep_sampler": "grid",
            "sweep_pruner": "none", "sweep_space": {"fit.learning_rate":
                                                    {"choices": SENSIBLE[:n]}}}
    trials = instance_costs(dag_test(env, "keras_retrain", conf, home / "project.log"), "trial")
    records = [json.loads(line) for line in times.read_text().splitlines()]
    children = spans(records, "child train")
    beyond = {i: trials[i] - (children[i][1] - children[i][0]) for i in trials}
    timing = {}  # the trial records' timing (training_airflow/records.py), by map index
    for path in (home / "data" / "runs").glob("*/airflow/trial*.json"):
        record = json.loads(path.read_text())
        timing[record["map_index"]] = record["timing"]
    report.figure("airflow dags test, each instance from its start to the next task's: empty "
                  + ", ".join(f"{i}: {s:.2f} s" for i, s in sorted(floor.items()))
                  + "; trial (child) " + ", ".join(
                      f"{i}: {trials[i]:.2f} s ({children[i][1] - children[i][0]:.2f} s)"
                      for i in sorted(trials)))
    report.figure("trial instances' records: " + "; ".join(
        f"{i}: started {t['started_s']:.2f} s, work beyond the child "
        f"{t['work_s'] - (children[i][1] - children[i][0]):.2f} s"
        for i, t in sorted(timing.items())))
    ratio = median(list(beyond.values())) / median(list(floor.values()))
    report.target(f"Airflow trial instance beyond its child <= {AIRFLOW_LIMIT}x an empty "
                  "mapped instance", ratio <= AIRFLOW_LIMIT,
                  f"median {median(list(beyond.values())):.2f} s vs "
                  f"{median(list(floor.values())):.2f} s: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8, help="pruning sweeps' trials, 2 to 8")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="the sweeps' --sweep-seed")
    parser.add_argument("--overhead-trials", type=int, default=4, help="<= 4")
    parser.add_argument("--reps", type=int, default=2, help="CLI overhead repetitions")
    parser.add_argument("--airflow-trials", type=int, default=4, help="<= 4")
    parser.add_argument("--no-airflow", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    began = time.time()
    bench = Bench(args.epochs)
    report = Report("Sweep (issue 41): pruning, overhead beyond training, concurrency")
    try:
        bench.run("--run-id=bench-warmup")  # not counted: stages digits, warms the caches
        pruning(bench, report, args)
        overhead_cli(bench, report, args)
        if args.no_airflow:
            report.figure("Airflow overhead: not measured (--no-airflow)")
        else:
            overhead_airflow(bench, report, args)
    finally:
        if args.keep:
            print(f"kept {bench.tmp}")
        else:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    report.figure(f"bench wall {time.time() - began:.0f} s, load {os.getloadavg()[0]:.1f}")
    report.finish()


if __name__ == "__main__":
    main()
