"""Benchmark 18, faults: a real triggerer killed under a deferred Kubernetes training, a
deferred task marked failed, a pod's line reaching the task log, and no triggerer at all
(issue 47), measured on a real Airflow.

Airflow is ``tools.standalone``'s ``Stack`` (api-server, scheduler, dag-processor,
triggerer; LocalExecutor), started here component by component so that the triggerer
alone can be killed and started again (``python -m tools.standalone`` stops everything
when one component dies). The DAG is bench/deferral.py's one ``train`` task on
``launcher: kubernetes`` with ``TRAINING_DEFERRABLE`` true, against the fake Kubernetes
API of the tests in this process (the only stand-in), status looks 1 s apart.

1. **A killed triggerer.** A run's Job is scripted to end on its ``--polls``-th status
   read. Once the task is deferred and the trigger has read the Job ``--reads`` times,
   the triggerer's process group is SIGKILLed, and the triggerer is started again
   ``--down-s`` later. Measured: the run's end, its train task's tries, the Jobs created
   for it (one: the new triggerer follows the same Job, by its name), and how long
   nobody read the Job.
2. **Marked failed.** A second run's Job never ends. While its task is deferred, the
   seconds from the moment a pod's line is there to read (the fake's log grows with its
   status reads) until the REST API's task log shows it (target: within 10 s); then the
   task is marked failed through the REST API (what the UI's "Mark as failed" calls),
   and measured: the seconds from that call to the Job's DELETE (the trigger's
   ``on_kill``). Target: within 10 s.
3. **No triggerer.** The triggerer is killed and left down until the API server reports
   it unhealthy. A run then defers: measured, the seconds from the trigger until its
   task log says that no triggerer runs (``triggerer_health.py``; target: within a
   minute), and, the triggerer started again, how the run ends.

    .venv/bin/python bench/deferral_faults.py [--polls 40] [--reads 5] [--down-s 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from _common import ROOT, Report
from deferral import DAG_ID, FakeKubernetes, Plan, environment

sys.path.insert(0, str(ROOT))  # the repository's tools/, as ``python -m tools...`` finds it
from tools.standalone import Stack, component_env, login_password, wait_ready  # noqa: E402

MARKED_FAILED_LIMIT_S = 10.0
LINE_LIMIT_S = 10.0


class Api:
    """The REST API of the stack on ``base``, as the admin."""

    def __init__(self, base: str, home: Path) -> None:
        self.base, self.token = base, None
        self.token = self.call("POST", "/auth/token", {
            "username": "admin", "password": login_password(home)})["access_token"]

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(self.base + path, method=method,
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read() or b"{}")

    def trigger(self) -> str:
        for _ in range(150):  # until the dag-processor has parsed the DAG
            try:
                self.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
                break
            except urllib.error.HTTPError:
                time.sleep(2)
        return self.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                         {"logical_date": None, "conf": {}})["dag_run_id"]

    def run_path(self, run: str) -> str:
        return f"/api/v2/dags/{DAG_ID}/dagRuns/{urllib.parse.quote(run, safe='')}"

    def train(self, run: str) -> dict:
        return self.call("GET", f"{self.run_path(run)}/taskInstances/train")

    def log(self, run: str) -> str:
        """The train task's first try's log as the REST API gives it ("" before it has
        one)."""
        try:
            return json.dumps(self.call("GET", f"{self.run_path(run)}/taskInstances/train/"
                                        "logs/1?full_content=true"))
        except urllib.error.HTTPError:
            return ""

    def wait(self, what: str, test, timeout: float = 600) -> float:
        """Until ``test()`` holds; the moment it did."""
        deadline = time.monotonic() + timeout
        while not test():
            if time.monotonic() > deadline:
                raise RuntimeError(f"waited {timeout:.0f} s for {what}")
            time.sleep(0.5)
        return time.time()


class Watched:
    """The fake's Job reads and deletes, with the moment of each."""

    def __init__(self, fake: FakeKubernetes) -> None:
        self.reads: list[tuple[float, str]] = []
        self.deleted: dict[str, float] = {}
        handle = fake.handle

        def watched(method: str, path: str, query: dict, body: dict | None):
            parts = path.strip("/").split("/")  # .../jobs/NAME[/status]
            name = parts[parts.index("jobs") + 1] if "jobs" in parts[:-1] else None
            if name and method == "GET":
                self.reads.append((time.time(), name))
            elif name and method == "DELETE":
                self.deleted.setdefault(name, time.time())
            return handle(method, path, query, body)

        fake.handle = watched

    def of(self, job: str) -> list[float]:
        return [at for at, name in self.reads if name == job]


def deferred_job(api: Api, fake: FakeKubernetes, plan: Plan) -> tuple[str, str, Any]:
    """A run triggered, its Job played by ``plan``, once its train task is deferred: the
    run, its Job, and what lists the Jobs created since the trigger."""
    before = {body["metadata"]["name"] for kind, _, body in fake.created() if kind == "jobs"}
    fake.plans.append(plan)
    run = api.trigger()
    api.wait("the train task deferred", lambda: api.train(run)["state"] == "deferred")

    def new() -> list[str]:
        return [body["metadata"]["name"] for kind, _, body in fake.created()
                if kind == "jobs" and body["metadata"]["name"] not in before]

    api.wait("the Job", lambda: bool(new()))
    return run, new()[0], new


def killed_triggerer(api: Api, stack: Stack, fake: FakeKubernetes, watched: Watched,
                     args: argparse.Namespace) -> dict:
    run, job, new = deferred_job(api, fake, Plan(polls=args.polls))
    api.wait(f"{args.reads} reads of the Job", lambda: len(watched.of(job)) >= args.reads)
    triggerer = stack.procs["triggerer"]
    killed = time.time()
    os.killpg(triggerer.pid, signal.SIGKILL)
    triggerer.wait(timeout=30)
    time.sleep(args.down_s)
    stack.restart("triggerer")
    restarted = time.time()
    path = api.run_path(run)
    api.wait("the run's end", lambda: api.call("GET", path)["state"] in ("success", "failed"))
    reads = watched.of(job)
    after = [at for at in reads if at > restarted]
    return {"state": api.call("GET", path)["state"], "tries": api.train(run)["try_number"],
            "jobs": len(new()), "unread": (after[0] if after else float("nan"))
            - max(at for at in reads if at <= killed),
            "picked_up": (after[0] - restarted) if after else float("nan")}


def marked_failed(api: Api, fake: FakeKubernetes, watched: Watched) -> dict:
    run, job, _ = deferred_job(api, fake, Plan(polls=100_000))
    # The fake shows a pod's log line k after k status reads ("line 0 again" is the
    # second line): worker 0's "line 3" from the Job's fourth read on.
    shown = api.wait("worker 0's line 3 in the task log",
                     lambda: "worker 0 line 3" in api.log(run), timeout=120)
    line_s = shown - watched.of(job)[3]
    marked = time.time()
    api.call("PATCH", f"{api.run_path(run)}/taskInstances/train", {"new_state": "failed"})
    deleted = api.wait("the Job's deletion", lambda: job in watched.deleted, timeout=120)
    return {"delete_s": watched.deleted[job] - marked, "seen_s": deleted - marked,
            "state": api.train(run)["state"], "line_s": line_s}


def no_triggerer(api: Api, stack: Stack, fake: FakeKubernetes) -> dict:
    """The triggerer killed and left down until the API server reports it unhealthy; a
    run then defers: when its task log says so, from the trigger; the triggerer started
    again, how the run ends."""
    triggerer = stack.procs["triggerer"]
    killed = time.time()
    os.killpg(triggerer.pid, signal.SIGKILL)
    triggerer.wait(timeout=30)
    stale = api.wait("the triggerer reported unhealthy", lambda: api.call(
        "GET", "/api/v2/monitor/health").get("triggerer", {}).get("status") != "healthy",
        timeout=300)
    fake.plans.append(Plan(polls=5))
    run = api.trigger()
    triggered = time.time()
    said = api.wait("the warning in the task log",
                    lambda: "no triggerer is running" in api.log(run), timeout=120)
    stack.restart("triggerer")
    path = api.run_path(run)
    api.wait("the run's end", lambda: api.call("GET", path)["state"] in ("success", "failed"))
    return {"stale_s": stale - killed, "said_s": said - triggered,
            "state": api.call("GET", path)["state"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, default=40)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--down-s", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=28490, help="and the two above it")
    args = parser.parse_args()
    report = Report("Deferral (issue 47): a killed triggerer, a deferred task's log and "
                    "its marking failed, no triggerer, on a real Airflow")
    fake = FakeKubernetes()
    fake.thread.start()
    watched = Watched(fake)
    with tempfile.TemporaryDirectory(prefix="bench-deferral-faults-") as tmp:
        env = component_env(environment(Path(tmp), fake, True), port=args.port)
        home = Path(env["AIRFLOW_HOME"])
        stack = Stack(env, home / "logs" / "standalone")
        try:
            stack.start()
            wait_ready(stack, env["AIRFLOW__API__BASE_URL"])
            api = Api(env["AIRFLOW__API__BASE_URL"], home)
            kill = killed_triggerer(api, stack, fake, watched, args)
            mark = marked_failed(api, fake, watched)
            down = no_triggerer(api, stack, fake)
        finally:
            stack.stop()
            fake.server.shutdown()
    report.figure(f"killed triggerer (down {args.down_s:g} s): the run {kill['state']}, its "
                  f"train task in {kill['tries']} try, {kill['jobs']} Job created, the Job "
                  f"unread for {kill['unread']:.1f} s, read again {kill['picked_up']:.1f} s "
                  "after the triggerer started again")
    report.target("a killed triggerer: the run goes on following the same Job",
                  kill["state"] == "success" and kill["jobs"] == 1 and kill["tries"] == 1,
                  f"{kill['state']}, {kill['jobs']} Job, try {kill['tries']}")
    report.target(f"a pod's line in the deferred task's log (REST API) within "
                  f"{LINE_LIMIT_S:g} s", mark["line_s"] <= LINE_LIMIT_S,
                  f"{mark['line_s']:.1f} s after the pod printed it")
    report.target(f"marked failed: the Job deleted within {MARKED_FAILED_LIMIT_S:g} s",
                  mark["delete_s"] <= MARKED_FAILED_LIMIT_S,
                  f"{mark['delete_s']:.1f} s (the task instance now {mark['state']})")
    report.figure(f"no triggerer: the API server reported it unhealthy {down['stale_s']:.0f}"
                  f" s after it was killed; a run's task said so in its log "
                  f"{down['said_s']:.1f} s after the trigger; with a triggerer started "
                  f"again, the run {down['state']}")
    report.target("no triggerer: the deferring task says so in its log within a minute",
                  down["said_s"] <= 60 and down["state"] == "success",
                  f"{down['said_s']:.1f} s, then {down['state']}")
    report.finish()


if __name__ == "__main__":
    main()
