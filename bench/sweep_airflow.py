"""Benchmark 16b: a sweep's trial tasks against Airflow's own floor for an empty mapped task.

Why: issue 41 bounds what a trial costs beyond its own training when Airflow runs it
(scheduling, the study's reads and writes, the pick) by 1.3x what Airflow spends on an
empty mapped task instance. Two DAGs, in one temporary Airflow home (the demo's
settings, as ``bench/orchestration.py``): the floor (an empty ``@task`` mapped over
``--trials`` instances, then one empty task) and ``keras_retrain`` with a sweep of as
many trials (grid over sensible learning rates, parallel 1, pruner none, ``--epochs``).
A trial's training is its child's wall, spawn to exit, timed by ``bench/sweep.py``'s
``sitecustomize`` hook (the same in every process of the run).

1. **A real executor** (the target): ``python -m tools.standalone`` (what ``./dev
   airflow`` runs: api-server, scheduler, dag-processor, triggerer; LocalExecutor), with
   ``AIRFLOW__CORE__PARALLELISM=1``, so one task instance runs at a time. Both DAGs are
   triggered through the REST API (floor, sweep, floor again). A mapped instance's cost
   is from the end of the instance before it (the previous one, or the upstream task
   for the first) to its own end, from the REST API's task instances: the scheduler's
   turn, the task process, the work. A trial's, minus its child. The pick: ``train``
   after the last trial, against the floor's task after its last empty instance.
   Target: median trial instance beyond its child <= 1.3x median empty instance.
2. **``airflow dags test``** (for comparison; one process, no executor): each
   instance from its ``[DAG TEST] starting`` line to the next task's.

    .venv/bin/python bench/sweep_airflow.py [--trials 4] [--epochs 2] [--no-dags-test]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

from _common import PYTHON, ROOT, Report, median
from sweep import SENSIBLE, Bench, spans

LIMIT = 1.3
FLOOR_DAG_ID, DAG_ID = "bench_sweep_floor", "keras_retrain"
FLOOR_DAG = '''"""An empty task mapped over {n} instances, then one: the floor."""
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
FLOOR_TASKS, SWEEP_TASKS = ("slots", "empty", "after"), ("plan_trials", "trial", "train")


def sweep_conf(trials: int, epochs: int) -> dict:
    return {"epochs": epochs, "min_accuracy": 0, "backup_interval_s": 0, "force_train": True,
            "sweep_trials": trials, "sweep_parallel": 1, "sweep_sampler": "grid",
            "sweep_pruner": "none",
            "sweep_space": {"fit.learning_rate": {"choices": SENSIBLE[:trials]}}}


def airflow_home(bench: Bench, name: str, trials: int) -> dict[str, str]:
    """A migrated Airflow home whose DAG folder holds the project's DAGs and the floor."""
    home, dags = bench.tmp / name, bench.tmp / name / "dags"
    dags.mkdir(parents=True)
    for dag in (ROOT / "dags").glob("*.py"):
        (dags / dag.name).symlink_to(dag)
    (dags / "floor.py").write_text(FLOOR_DAG.format(n=trials, dag_id=FLOOR_DAG_ID))
    env = {**bench.env(home / "times.jsonl"), "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "TRAINING_DATA_DIR": str(home / "data"),
           "TRAINING_DEADLINE_MINUTES": "", "TRAINING_SCHEDULE": ""}
    subprocess.run([str(ROOT / ".venv" / "bin" / "airflow"), "db", "migrate"], env=env,
                   cwd=ROOT, check=True, capture_output=True)
    return env


def children(env: dict[str, str]) -> dict[int, float]:
    records = [json.loads(line) for line in Path(env["BENCH_SWEEP_TIMES"]).read_text()
               .splitlines()]
    return {slot: end - start for slot, (start, end) in spans(records, "child train").items()}


class Standalone:
    """``python -m tools.standalone --port P`` in ``env``: its REST API, then its stop."""

    def __init__(self, env: dict[str, str], port: int) -> None:
        self.env, self.base = env, f"http://127.0.0.1:{port}"
        self.out = Path(env["AIRFLOW_HOME"]) / "standalone.out"
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen([PYTHON, "-m", "tools.standalone", "--port", str(port)],
                                         cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 300
        while not (login := re.search(r"login:\s+admin / (\S+)", self.out.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tools.standalone did not start: see {self.out}")
            time.sleep(1)
        self.token = self.call("POST", "/auth/token", {"username": "admin",
                                                       "password": login[1]})["access_token"]

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(self.base + path, method=method,
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        if getattr(self, "token", None):
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read() or b"{}")

    def run(self, dag_id: str, conf: dict, timeout: float = 900) -> list[dict]:
        """Trigger ``dag_id`` and wait for its end; its task instances."""
        deadline = time.monotonic() + timeout
        while True:  # until the dag-processor has parsed it
            try:
                self.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
                break
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        run_id = self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                           {"logical_date": None, "conf": conf})["dag_run_id"]
        path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}"
        while (state := self.call("GET", path)["state"]) not in ("success", "failed"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{dag_id} run {run_id} still {state}: see {self.out}")
            time.sleep(2)
        if state != "success":
            raise RuntimeError(f"{dag_id} run {run_id} {state}: see {self.out}")
        return self.call("GET", f"{path}/taskInstances?limit=200")["task_instances"]

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=120)


def costs(instances: list[dict], tasks: tuple[str, str, str]) -> tuple[dict[int, float], float]:
    """Each mapped instance's seconds from the end before it to its own end, and the
    task after's from the last mapped end (``tasks``: upstream, mapped, after)."""
    end = {(ti["task_id"], ti["map_index"]): datetime.fromisoformat(ti["end_date"]).timestamp()
           for ti in instances if ti["task_id"] in tasks}
    mapped = sorted((at, index) for (task, index), at in end.items() if task == tasks[1])
    previous, each = end[(tasks[0], -1)], {}
    for at, index in mapped:
        each[index], previous = at - previous, at
    return each, end[(tasks[2], -1)] - previous


def executor(bench: Bench, report: Report, args: argparse.Namespace) -> None:
    env = {**airflow_home(bench, "executor", args.trials), "AIRFLOW__CORE__PARALLELISM": "1"}
    stack = Standalone(env, args.port)
    try:
        floors = [stack.run(FLOOR_DAG_ID, {})]
        trials = stack.run(DAG_ID, sweep_conf(args.trials, args.epochs))
        floors.append(stack.run(FLOOR_DAG_ID, {}))
    finally:
        stack.stop()
    child = children(env)
    empty, after = [], []
    for instances in floors:
        each, last = costs(instances, FLOOR_TASKS)
        empty += list(each.values())
        after.append(last)
    each, pick = costs(trials, SWEEP_TASKS)
    beyond = {i: each[i] - child[i] for i in each}
    report.figure("LocalExecutor, one task at a time, each instance from the end before it to "
                  "its own: empty " + ", ".join(f"{s:.2f} s" for s in empty) + "; trial "
                  "(its child) " + ", ".join(f"{i}: {each[i]:.2f} s ({child[i]:.2f} s)"
                                             for i in sorted(each)))
    extra_pick = pick - median(after)
    report.figure(f"the pick (train after the last trial) {pick:.2f} s vs the floor's task "
                  f"after {median(after):.2f} s: {extra_pick:.2f} s more, "
                  f"{extra_pick / len(each):.2f} s a trial")
    ratio = median(list(beyond.values())) / median(empty)
    with_pick = (median(list(beyond.values())) + extra_pick / len(each)) / median(empty)
    report.target(f"LocalExecutor: trial instance beyond its child <= {LIMIT}x an empty "
                  "mapped instance", ratio <= LIMIT,
                  f"median {median(list(beyond.values())):.2f} s vs {median(empty):.2f} s: "
                  f"{ratio:.2f}x; {with_pick:.2f}x with the pick's extra spread over the "
                  "trials")


def dag_test(env: dict[str, str], dag_id: str, conf: dict | None, log: Path) -> list[tuple]:
    """``airflow dags test``; the ``[DAG TEST] starting`` lines: (time, task, map index)."""
    command = [str(ROOT / ".venv" / "bin" / "airflow"), "dags", "test", dag_id]
    if conf is not None:
        command += ["-c", json.dumps(conf)]
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"airflow dags test {dag_id} exited {done.returncode}: see {log}")
    return [(datetime.fromisoformat(m[1]).timestamp(), m[2], int(m[3]))
            for line in log.read_text().splitlines() if (m := STARTING.match(line))]


def instance_costs(starts: list[tuple], task: str) -> dict[int, float]:
    """Map index -> seconds from the instance's start to the next task's start."""
    return {index: starts[k + 1][0] - at for k, (at, name, index) in enumerate(starts[:-1])
            if name == task}


def in_dags_test(bench: Bench, report: Report, args: argparse.Namespace) -> None:
    env = airflow_home(bench, "dags-test", args.trials)
    home = Path(env["AIRFLOW_HOME"])
    floor = instance_costs(dag_test(env, FLOOR_DAG_ID, None, home / "floor.log"), "empty")
    trials = instance_costs(dag_test(env, DAG_ID, sweep_conf(args.trials, args.epochs),
                                     home / "sweep.log"), "trial")
    child = children(env)
    beyond = {i: trials[i] - child[i] for i in trials}
    report.figure("airflow dags test, each instance from its start to the next task's: empty "
                  + ", ".join(f"{i}: {s:.2f} s" for i, s in sorted(floor.items()))
                  + "; trial (its child) " + ", ".join(
                      f"{i}: {trials[i]:.2f} s ({child[i]:.2f} s)" for i in sorted(trials)))
    report.figure(f"airflow dags test (no executor, for comparison): trial instance beyond its "
                  f"child {median(list(beyond.values())):.2f} s vs an empty mapped instance "
                  f"{median(list(floor.values())):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4, help=f"<= {len(SENSIBLE)}")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--port", type=int, default=28380, help="and the two above it")
    parser.add_argument("--no-dags-test", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    bench = Bench(args.epochs)
    report = Report("Sweep (issue 41) through Airflow: trial tasks against an empty mapped "
                    "task")

    def measure() -> None:
        executor(bench, report, args)
        if not args.no_dags_test:
            in_dags_test(bench, report, args)

    bench.measured(measure, report, keep=args.keep)

if __name__ == "__main__":
    main()
