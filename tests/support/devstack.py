"""``./dev airflow`` exactly as the README starts it, for the system tests.

The working tree (the tracked files and the untracked ones git does not ignore: what a
clone of this commit holds) is copied into a temporary directory, and ``./dev airflow
--port P`` runs there as a subprocess, with the environment a new user has: this
process's environment without ``AIRFLOW_*``, ``TRAINING_*``, ``AWS_*``, ``TF_*``,
``PYTHON*`` and ``VIRTUAL_ENV``, and without PATH entries inside a virtual
environment. ``./dev`` sets up the copy's own ``.venv`` (``uv sync`` from the lock;
hard links from uv's cache), ``.airflow/`` and ``var/``. The login is read from what
``./dev airflow`` prints, as a person reads it. Ctrl-C (SIGINT) stops it at the end.

Tests drive the UI in a browser and check the REST API beside it, with a JWT from
``POST /auth/token``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.fresh import artifacts_dir, new_user_env

from tools.standalone import descendants

__all__ = ["CHROMIUM", "DAG_ID", "USER", "DevAirflow", "artifacts_dir", "running", "save_logs"]

DAG_ID = "keras_retrain"
USER = "admin"
STARTUP_TIMEOUT_S = 420.0  # set-up of a fresh .venv, db migrate, four components
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")


def free_port_pair() -> int:
    """A port P with P, P+1 and P+2 free (the UI and the two log servers)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port > 65530:
            continue
        try:
            for offset in (1, 2):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError("no three consecutive free ports on 127.0.0.1")


class ApiError(AssertionError):
    """An unexpected HTTP answer from the api-server."""


class DevAirflow:
    """``./dev airflow --port P`` in a fresh copy: its process, its output, HTTP helpers."""

    command = "airflow"  # ./dev's subcommand
    ready_line = "Airflow is ready: "  # the banner's first line

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = env or {}  # what a deployment adds to a new user's environment
        self.port = free_port_pair()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.home = root / ".airflow"
        self.store_uri = os.fspath(root / "var" / "store")
        self.output_path = root.parent / "dev-airflow.out"
        self.lines: list[str] = []
        self.password: str | None = None
        self.proc: subprocess.Popen | None = None
        self._token: str | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["./dev", self.command, "--port", str(self.port)], cwd=self.root,
            env={**new_user_env(), **self.env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_as_in_a_terminal,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.output_path, "w") as copy:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                self.lines.append(line)
                copy.write(line + "\n")
                copy.flush()

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Until ``./dev airflow`` prints its banner; the password from its login line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if any(line.startswith(self.ready_line) for line in self.lines):
                login = next((line for line in self.lines if "login:" in line), "")
                match = re.search(rf"login:\s+{USER} / (\S+)", login)
                if match:
                    self.password = match.group(1)
                    return
            time.sleep(1.0)
        raise RuntimeError(f"./dev {self.command} printed no ready banner in {timeout:.0f} s\n"
                           + self.diagnostics())

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"./dev {self.command} exited with code {self.proc.returncode}\n"
                               + self.diagnostics())

    def stop(self, grace_s: float = 60.0) -> None:
        """Ctrl-C, as a person stops it. Whatever of it is still there after ``grace_s``
        (the command or any process it started) is killed, and that is an error: Ctrl-C
        must stop everything."""
        if self.proc is None:
            return
        tree = descendants(self.proc.pid)
        stopped = self.proc.poll() is not None
        if not stopped:
            os.kill(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
                stopped = True
        left = [pid for pid in tree if _running(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if not stopped or left:
            raise RuntimeError(f"./dev {self.command} did not stop on Ctrl-C within "
                               f"{grace_s:.0f} s: {len(left)} of its processes killed")

    # -- HTTP, beside the browser

    def call(self, method: str, path: str, body: Any = None, *, auth: bool = True,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if auth:
            request.add_header("Authorization", f"Bearer {self.token()}")
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return status, decoded

    def request(self, method: str, path: str, body: Any = None, *, expect: int = 200,
                **kwargs: Any) -> Any:
        status, decoded = self.call(method, path, body, **kwargs)
        if status != expect:
            raise ApiError(f"{method} {path} answered {status}, expected {expect}: {decoded}")
        return decoded

    def token(self) -> str:
        if self._token is None:
            self._token = self.request(
                "POST", "/auth/token", {"username": USER, "password": self.password},
                expect=201, auth=False,
            )["access_token"]
        return self._token

    # -- runs

    def runs(self) -> list[dict]:
        return self.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?order_by=run_after"
                                   "&limit=100")["dag_runs"]

    def task_states(self, run_id: str) -> dict[str, str | None]:
        listed = self.request(
            "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in listed["task_instances"]}

    def wait_for_run(self, run_id: str, timeout: float = 420.0) -> dict:
        """Until the run ends, or a task fails or is up for retry (it broke)."""
        broken = {"failed", "upstream_failed", "up_for_retry", "removed"}
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            run = self.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id)}")
            states = self.task_states(run_id)
            if run["state"] in ("success", "failed") or broken & set(states.values()):
                return run
            if time.monotonic() > deadline:
                pytest.fail(f"run {run_id} still {run['state']} after {timeout:.0f} s; "
                            f"tasks: {states}\n{self.diagnostics(run_id)}")
            time.sleep(2.0)

    def xcom(self, run_id: str, task_id: str, key: str = "return_value") -> Any:
        entry = self.request(
            "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{task_id}/"
                   f"xcomEntries/{key}")
        value = entry["value"]
        return json.loads(value) if isinstance(value, str) else value

    # -- diagnostics

    def task_logs(self, run_id: str | None = None) -> list[Path]:
        logs = self.home / "logs" / f"dag_id={DAG_ID}"
        pattern = f"run_id={run_id}/**/*.log" if run_id else "**/*.log"
        return sorted(logs.glob(pattern))

    def diagnostics(self, run_id: str | None = None) -> str:
        parts = ["----- ./dev airflow output (tail) -----\n" + "\n".join(self.lines[-40:])]
        for log in sorted((self.home / "logs" / "standalone").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"----- {log.name} (tail) -----\n" + "\n".join(text))
        for path in self.task_logs(run_id):
            text = path.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"----- task log {path.relative_to(self.home)} (tail) -----\n"
                         + "\n".join(text))
        return "\n".join(parts)


def _as_in_a_terminal() -> None:
    """The child's Ctrl-C as a terminal gives it: a test run started in the background
    of a script (``./dev test &``) inherits SIGINT ignored, and so would the stack."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _running(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@contextlib.contextmanager
def running(stack: DevAirflow, logs: str = "dev-airflow-logs.tar.gz"):
    """``stack`` started and ready; at the end stopped (Ctrl-C) and its logs saved."""
    try:
        stack.start()
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()
        save_logs(stack, logs)


def save_logs(stack: DevAirflow, name: str = "dev-airflow-logs.tar.gz") -> None:
    """The copy's component and task logs, next to the screenshots."""
    target = artifacts_dir() / name
    with tarfile.open(target, "w:gz") as tar:
        if stack.output_path.exists():
            tar.add(stack.output_path, arcname="dev-airflow.out")
        for logs in {stack.home / "logs", getattr(stack, "logs", stack.home / "logs")}:
            if logs.exists():
                tar.add(logs, arcname=os.fspath(logs.relative_to(stack.root)))
