"""``./dev stack`` exactly as the README starts it, for the deployment tests.

Like ``devstack.DevAirflow`` (a fresh copy of the tree, a new user's environment, the
login read from what it prints, Ctrl-C at the end), with what the production stack adds:
its secrets file, a plain boto3 reader with the store's own key, and the processes a test
kills to inject a fault (found in ``/proc`` by their command lines, as a person finds
them with ``ps``). It runs two workers on the default queue (``TRAINING_STACK_DEFAULT_
WORKERS=2``, what ``--default-workers 2`` does: the default queue's concurrency shared
by two workers, as a deployment scaled out to two machines), so that a sweep's trials
can be seen training on two workers at once, and a retry delay of ``RETRY_DELAY_S``
seconds (``TRAINING_RETRY_DELAY_SECONDS``, docs/configuration.md; a minute by default):
the fault tests wait on a retry after each fault, not on a minute of nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from support.devstack import DAG_ID, DevAirflow, quote

from tools.services import free_port_block
from tools.stack import span
from tools.standalone import descendants

MODEL = "digits-mlp"
RUN_TIMEOUT_S = 600.0
DEFAULT_WORKERS = 2
# A failed task's retry waits 10-20 s (Airflow adds jitter), the second 20-40 s: room
# for a restarted worker or database, without a minute of nothing after every fault.
RETRY_DELAY_S = 10


def rehash(client: Any, version: str, model: str = MODEL, bucket: str = "models",
           root: str = "registry") -> dict[str, Any]:
    """A published version's manifest, every object it names read back with a plain boto3
    ``client`` and re-hashed against it (what any reader of the store can check)."""
    prefix = f"{root}/models/{model}/versions/{version}"
    manifest = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")
                          ["Body"].read())
    for entry in manifest["files"]:
        data = client.get_object(Bucket=bucket, Key=f"{prefix}/{entry['path']}")["Body"].read()
        assert len(data) == entry["size"], entry
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry
    return manifest


def processes() -> dict[int, str]:
    """Every live process's pid and command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes() \
                    .replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
    return found


class DevStack(DevAirflow):
    """``./dev stack --port P`` in a fresh copy: its process, output, store and faults."""

    command = "stack"
    ready_line = "The production stack is ready: "

    def __init__(self, root: Path, default_workers: int = DEFAULT_WORKERS) -> None:
        super().__init__(root, {"TRAINING_STACK_DEFAULT_WORKERS": str(default_workers),
                                "TRAINING_RETRY_DELAY_SECONDS": str(RETRY_DELAY_S)})
        self.port = free_port_block(span(default_workers))
        # The default queue's workers, by the names of their logs (tools/stack.py).
        self.default_workers = {"worker", *(f"worker-{n}"
                                            for n in range(2, default_workers + 1))}
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.stack_dir = root / ".stack"
        self.home = self.stack_dir / "airflow"
        self.logs = self.stack_dir / "logs"
        self.store_uri = "s3://models/registry"
        self.output_path = root.parent / "dev-stack.out"

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        """As ``DevAirflow.call``, again for up to a minute while the api-server answers
        500/503 or not at all: while a fault test has its database down, the API fails
        its requests, as it should, and a person reloads the page."""
        deadline = time.monotonic() + 60.0
        while True:
            try:
                status, decoded = super().call(method, path, body, **kwargs)
            except OSError:
                status, decoded = None, None
            if status not in (None, 500, 502, 503) or time.monotonic() > deadline:
                if status is None:
                    raise AssertionError(f"{method} {path}: the api-server did not answer")
                return status, decoded
            time.sleep(2.0)

    def secrets(self) -> dict[str, str]:
        lines = (self.stack_dir / "secrets.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line
                    and not line.startswith("#"))

    def s3(self):
        """A plain boto3 client with the store identity's key (what Airflow holds)."""
        import boto3

        keys = self.secrets()
        return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port + 6}",
                            region_name="us-east-1",
                            aws_access_key_id=keys["STORE_ACCESS_KEY"],
                            aws_secret_access_key=keys["STORE_SECRET_KEY"])

    def rehash(self, version: str, model: str = MODEL) -> dict[str, Any]:
        """The version's manifest, every object it names read back and re-hashed."""
        return rehash(self.s3(), version, model)

    def versions(self, model: str = MODEL) -> set[str]:
        listed = self.s3().list_objects_v2(Bucket="models",
                                            Prefix=f"registry/models/{model}/versions/")
        return {key["Key"].split("/")[4] for key in listed.get("Contents", [])}

    def production(self, model: str = MODEL) -> dict[str, Any] | None:
        try:
            body = self.s3().get_object(Bucket="models",
                                        Key=f"registry/models/{model}/production.json")
        except self.s3().exceptions.NoSuchKey:
            return None
        return json.loads(body["Body"].read())

    # -- runs and tasks, over REST; what the workers' own logs say

    def trigger(self, conf: dict) -> str:
        """A run of the DAG with ``conf``, unpaused first (as the form's box does)."""
        self.request("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
        run = self.request("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                           {"logical_date": None, "conf": conf})
        return run["dag_run_id"]

    def run_state(self, run_id: str) -> str:
        return self.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id)}")["state"]

    def wait_end(self, run_id: str, timeout: float = RUN_TIMEOUT_S) -> str:
        """The run's final state; retries are part of the run (faults cause them)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            state = self.run_state(run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(2.0)
        raise AssertionError(f"run {run_id} did not end in {timeout:.0f} s; tasks "
                             f"{self.task_states(run_id)}\n{self.diagnostics(run_id)}")

    def task(self, run_id: str, task_id: str) -> dict:
        return self.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id)}/"
                                   f"taskInstances/{task_id}")

    def wait_task(self, run_id: str, task_id: str, states: set[str],
                  timeout: float = 300.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            ti = self.task(run_id, task_id)
            if ti["state"] in states:
                return ti
            if time.monotonic() > deadline:
                raise AssertionError(f"{task_id} of {run_id} not in {states} after "
                                     f"{timeout:.0f} s: {ti['state']}\n"
                                     + self.diagnostics(run_id))
            time.sleep(0.3)

    def task_log(self, run_id: str, task_id: str, attempt: int = 1,
                 map_index: int = -1) -> Path:
        task = (self.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}"
                / f"task_id={task_id}")
        if map_index >= 0:  # Airflow's log path template: a mapped instance's own folder
            task = task / f"map_index={map_index}"
        return task / f"attempt={attempt}.log"

    def worker_logs(self) -> dict[str, str]:
        """Each Celery worker's own log (``worker``, ``worker-2`` ..., ``worker-gpu``)."""
        return {name: (self.logs / f"{name}.log").read_text(errors="replace")
                for name in (*sorted(self.default_workers), "worker-gpu")}

    def ran_on(self, run_id: str, task_id: str) -> set[str]:
        """The Celery workers whose own logs say they executed this task of this run."""
        run = re.escape(run_id)
        pattern = re.compile(rf"task_id='{task_id}'.*run_id='{run}'"
                             rf"|run_id='{run}'.*task_id='{task_id}'")
        return {name for name, log in self.worker_logs().items() if pattern.search(log)}

    def executed(self, ti_id: str) -> set[str]:
        """The Celery workers whose own logs say they executed the task instance whose
        id (the REST API's ``id``) is ``ti_id`` (``Executing workload in Celery: ...``)."""
        pattern = re.compile(rf"Executing workload in Celery: .*{re.escape(ti_id)}")
        return {name for name, log in self.worker_logs().items() if pattern.search(log)}

    # -- the processes it started

    def pid_of(self, needle: str) -> int:
        """The one process of this stack whose command line contains ``needle``."""
        mine = set(descendants(self.proc.pid)) if self.proc else set()
        found = [pid for pid, cmd in processes().items() if pid in mine and needle in cmd]
        assert len(found) >= 1, f"no process of the stack runs {needle!r}"
        return min(found)  # the parent of a pre-forking server

    def kill_tree(self, pid: int) -> list[int]:
        """SIGKILL ``pid`` and every descendant at once (what a machine's death does)."""
        doomed = [pid, *descendants(pid)]
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first: nothing respawns
            for each in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(each, sig)
        return doomed

    def wait_line(self, path: Path, needle: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if path.exists() and needle in path.read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise AssertionError(f"{needle!r} not in {path} after {timeout:.0f} s\n"
                             + self.diagnostics())

    def diagnostics(self, run_id: str | None = None) -> str:
        parts = [super().diagnostics(run_id)]
        for log in sorted(self.logs.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-20:]
            parts.append(f"----- {log.name} (tail) -----\n" + "\n".join(tail))
        return "\n".join(parts)
