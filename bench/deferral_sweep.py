"""Benchmark 18, a sweep: 4 trials at ``parallel`` 4 under ``launcher: kubernetes`` on a
real executor with 2 worker slots (``--slots``), deferral off and on, side by side
(issue 47).

A real Airflow (``python -m tools.standalone``: LocalExecutor, ``parallelism`` the
``--slots``) runs a DAG of ``plan_trials`` and the mapped ``trial`` task of ``keras_retrain``
(``training_airflow.sweep_tasks``: the study, the lanes, each trial's Job, the tell, for
real), against the fake Kubernetes API of the tests in this process (the only stand-in).
Each Job ends on its ``--polls``-th status read, looks 1 s apart, and plays its pods'
part as tests/dags/test_kubernetes_trials.py's fake does: it writes the trial's
``history.json``. The REST API's task instances are sampled every 0.5 s: how many hold a
worker slot (``running``) and how many wait in the triggerer (``deferred``); the fake
records each Job's life. After each run the study says how many trials trained at once.

    .venv/bin/python bench/deferral_sweep.py [--polls 20] [--parallel 4] [--slots 2]

With ``--parallel 2`` the last two trials find every lane taken: deferred, they wait in
a ``LaneTrigger`` (no worker slot) and claim a lane when one frees; the study must then
show at most 2 trials training at once.

Target: deferred, the 4 Jobs train at the same time while the worker slots (at most
``--slots`` are held, all there are) are held only for the seconds of create and resume;
in the task, as many Jobs at a time as there are slots.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.parse
from pathlib import Path

from _common import Report
from deferral import FakeKubernetes, Plan, completions, environment, job_creations, unpause
from sweep_airflow import Standalone

DAG_ID = "bench_deferral_sweep"
TRIALS = 4
RATES = [0.001, 0.003, 0.01, 0.03]
STAGED = {"name": "digits", "version": "1.0.0", "path": "/data/datasets/digits/1.0.0",
          "staging_dir": "/data/datasets", "fingerprint": "2" * 64}



def params(parallel: int) -> dict:
    return {"launcher": "kubernetes", "epochs": 3, "sweep_trials": TRIALS,
            "sweep_parallel": parallel, "sweep_sampler": "grid", "sweep_pruner": "none",
            "sweep_space": {"fit.learning_rate": {"choices": RATES}}}


DAG = '''"""plan_trials and the mapped trial task of keras_retrain (bench/deferral_sweep.py)."""
import datetime as dt

from airflow.sdk import DAG

from training_airflow.sweep_tasks import MAP_INDEX_TEMPLATE, PlanTrialsOperator, TrialOperator

with DAG("{dag_id}", schedule=None, catchup=False, params={params!r},
         start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)):
    slots = PlanTrialsOperator(task_id="plan_trials", staged={staged!r}, validated={{}},
                               retries=0).output
    TrialOperator.partial(task_id="trial", staged={staged!r}, retries=0,
                          map_index_template=MAP_INDEX_TEMPLATE).expand(slot=slots)
'''


def pods_train(fake: FakeKubernetes) -> None:
    """The Job's pods' part: the trial's history, written where its task reads it."""
    from training import layout

    def train(job: dict) -> None:
        config = json.loads(fake.objects[("configmaps", job["metadata"]["name"])]
                            ["data"]["config.json"])
        run_dir = Path(config["storage"]["output_dir"]) / config["storage"]["run_id"]
        history = layout.model_dir(run_dir) / layout.HISTORY
        history.parent.mkdir(parents=True, exist_ok=True)
        rate = config["fit"]["learning_rate"]
        history.write_text(json.dumps({"metrics": {"val_loss": [1.0, 0.5, 0.2 - rate]}}))

    fake.on_start = train


def sweep_run(tmp: Path, fake: FakeKubernetes, done: dict[str, float], deferrable: bool,
              args: argparse.Namespace) -> dict:
    env = environment(tmp, fake, deferrable)
    (Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{DAG_ID}.py").write_text(DAG.format(
        dag_id=DAG_ID, params=params(args.parallel), staged=STAGED))
    env["AIRFLOW__CORE__PARALLELISM"] = str(args.slots)
    stack = Standalone(env, args.port)
    created, create = job_creations(fake)
    try:
        unpause(stack, DAG_ID)
        fake.plans += [Plan(polls=args.polls) for _ in range(TRIALS)]
        run = stack.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                         {"logical_date": None, "conf": {}})["dag_run_id"]
        path = f"/api/v2/dags/{DAG_ID}/dagRuns/{urllib.parse.quote(run, safe='')}"
        samples, start = [], time.monotonic()
        while True:
            states = [ti["state"] for ti in stack.call(
                "GET", f"{path}/taskInstances?limit=100")["task_instances"]]
            samples.append((time.monotonic() - start, states.count("running"),
                            states.count("deferred")))
            if stack.call("GET", path)["state"] in ("success", "failed"):
                break
            if time.monotonic() - start > 900:
                raise RuntimeError("the sweep did not end in 15 minutes")
            time.sleep(0.5)
        state = stack.call("GET", path)["state"]
    finally:
        fake._create_job = create
        stack.stop()
    lives = [(created[name], done.get(name, float("inf"))) for name in created]
    moments = sorted({at for life in lives for at in life if at != float("inf")})
    together = max((sum(1 for begin, end in lives if begin <= at < end) for at in moments),
                   default=0)
    return {"state": state, "wall": samples[-1][0], "jobs": len(lives),
            "together": together, "max_running": max(r for _, r, _ in samples),
            "busy": sum(1 for _, r, _ in samples if r) / len(samples),
            "both": sum(1 for _, r, _ in samples if r >= 2) / len(samples),
            "max_deferred": max(d for _, _, d in samples),
            "study": study_at_once(Path(env["TRAINING_DATA_DIR"]))}


def study_at_once(data_dir: Path) -> int:
    """The most trials of the night the study shows training at the same moment."""
    import optuna

    files = list(data_dir.rglob("*.db")) + list(data_dir.rglob("*.sqlite3"))
    most = 0
    for file in files:
        try:
            summaries = optuna.get_all_study_summaries(f"sqlite:///{file}")
        except Exception:  # noqa: BLE001 - not a study's database
            continue
        for summary in summaries:
            study = optuna.load_study(study_name=summary.study_name,
                                      storage=f"sqlite:///{file}")
            spans = [(t.datetime_start, t.datetime_complete) for t in study.trials
                     if t.datetime_start and t.datetime_complete]
            for begin, _ in spans:
                most = max(most, sum(1 for b, e in spans if b <= begin < e))
    return most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=TRIALS,
                        help="the sweep's parallel: under 4, trials wait for a lane")
    parser.add_argument("--slots", type=int, default=2,
                        help="worker slots: LocalExecutor's parallelism")
    parser.add_argument("--port", type=int, default=28540, help="and the two above it")
    args = parser.parse_args()
    report = Report(f"Deferral (issue 47): a sweep of {TRIALS} trials at parallel "
                    f"{args.parallel} on Kubernetes, {args.slots} worker slot(s)")
    fake = FakeKubernetes()
    fake.thread.start()
    done = completions(fake)
    pods_train(fake)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-deferral-sweep-") as tmp:
            seen = {mode: sweep_run(Path(tmp) / mode, fake, done, mode == "deferred", args)
                    for mode in ("in-task", "deferred")}
    finally:
        fake.server.shutdown()
    for mode, got in seen.items():
        report.figure(f"{mode}: the sweep {got['state']} in {got['wall']:.1f} s, "
                      f"{got['jobs']} Jobs, at most {got['together']} alive at once, worker "
                      f"slots held in {got['busy']:.0%} of the samples, both in "
                      f"{got['both']:.0%} (at most "
                      f"{got['max_running']} running, {got['max_deferred']} deferred), the "
                      f"study: at most {got['study']} trials training at once")
    on, off = seen["deferred"], seen["in-task"]
    report.target(f"deferred: {args.parallel} Jobs train at once on {args.slots} worker "
                  "slot(s), never "
                  "more trials than parallel", on["state"] == "success"
                  and on["together"] == args.parallel and on["study"] <= args.parallel,
                  f"{on['together']} at once (in the task: {off['together']}), "
                  f"{on['wall']:.0f} s against {off['wall']:.0f} s")
    report.finish()


if __name__ == "__main__":
    main()
