"""A real Airflow on 127.0.0.1 for the system tests: api-server, scheduler, dag-processor.

One stack per test session, in a fresh ``AIRFLOW_HOME`` under pytest's tmp dir:
LocalExecutor on a SQLite database, the project's ``dags/`` and ``plugins/``, the
default SimpleAuthManager with one ``admin`` user whose password the fixture writes,
and a model store on the local filesystem. Each component is a child process in its
own session (process group) that logs to a file; the logs are part of every failure
message. The environment of the children is built here from scratch for the AIRFLOW_*
and TRAINING_* keys, so settings of the test process (or of other tests) never leak in.

Tests talk to the stack only over HTTP, as the UI does: a JWT from ``POST /auth/token``
sent as ``Authorization: Bearer``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "keras_retrain"
USER = "admin"
STARTUP_TIMEOUT_S = 180.0
COMPONENTS = {
    "api-server": ["api-server", "--host", "127.0.0.1", "--port", "{port}"],
    "scheduler": ["scheduler"],
    "dag-processor": ["dag-processor"],
}
# Keys of the test process environment that must not reach the stack.
_FOREIGN_PREFIXES = ("AIRFLOW_", "AIRFLOW__", "TRAINING_", "AWS_", "_AIRFLOW")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc.strerror}>"
    return "\n".join(text.splitlines()[-lines:])


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a process from a later one with its pid)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            started = _start_time(child)
            if started is not None:
                found.append((child, started))
            todo.append(child)
    return found


def _kill(pid: int, sig: int, *, group: bool = False) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ApiError(AssertionError):
    """An unexpected HTTP answer from the api-server."""


@dataclass
class AirflowStack:
    """One Airflow deployment: paths, env, the component processes and an HTTP client."""

    root: Path
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _token: str | None = None

    def __post_init__(self) -> None:
        self.home = self.root / "airflow-home"
        self.logs = self.root / "component-logs"
        self.store_uri = os.fspath(self.root / "store")
        self.data_dir = self.root / "training"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.password = secrets.token_urlsafe(16)
        self.passwords_file = self.home / "simple_auth_manager_passwords.json"
        self.airflow = os.fspath(Path(sys.executable).with_name("airflow"))
        self.env = self._environment()

    # -- set-up

    def _environment(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
        venv_bin = os.fspath(Path(sys.executable).parent)
        return {
            **base,
            "PATH": venv_bin + os.pathsep + base.get("PATH", "/usr/bin:/bin"),
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "AIRFLOW_HOME": os.fspath(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": os.fspath(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": os.fspath(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            # Two cores: at most two task processes, one api-server worker.
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            # Task processes reach the api-server's execution API here.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # The scheduler signs task tokens, the api-server checks them: one secret.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(64),
            # LocalExecutor's log server, on a free port (several sessions may run at once).
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": os.fspath(self.passwords_file),
            # Manual runs only: no scheduled run may appear when the DAG is unpaused.
            "TRAINING_SCHEDULE": "",
            "TRAINING_DATA_DIR": os.fspath(self.data_dir),
            "TRAINING_STORE_URI": self.store_uri,
        }

    def start(self) -> None:
        self.home.mkdir(parents=True)
        self.logs.mkdir(parents=True)
        self.passwords_file.write_text(json.dumps({USER: self.password}) + "\n")
        migrate = subprocess.run(
            [self.airflow, "db", "migrate"], env=self.env, cwd=self.root,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        )
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stdout[-5000:]}")
        for name, args in COMPONENTS.items():
            with open(self.logs / f"{name}.log", "wb") as log:
                self.procs[name] = subprocess.Popen(
                    [self.airflow, *(a.format(port=self.port) for a in args)],
                    env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """API answering, scheduler and dag-processor healthy, the DAG parsed, a token."""
        deadline = time.monotonic() + timeout
        waiting_for, last_error = "the api-server", "none"
        while True:
            self.check_alive()
            try:
                if waiting_for == "the api-server":
                    self.token()
                    waiting_for = "a healthy scheduler and dag-processor"
                if waiting_for == "a healthy scheduler and dag-processor":
                    health = self.request("GET", "/api/v2/monitor/health", auth=False)
                    if all(health.get(c, {}).get("status") == "healthy"
                           for c in ("metadatabase", "scheduler", "dag_processor")):
                        waiting_for = f"DAG {DAG_ID} to be parsed"
                if waiting_for.startswith("DAG"):
                    errors = self.request("GET", "/api/v2/importErrors")
                    if errors["total_entries"]:
                        raise RuntimeError(
                            f"DAG import errors:\n{json.dumps(errors, indent=2)}\n"
                            + self.diagnostics()
                        )
                    status, _ = self.call("GET", f"/api/v2/dags/{DAG_ID}")
                    if status == 200:
                        return
            except (OSError, ApiError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Airflow not ready after {timeout:.0f} s: waiting for {waiting_for} "
                    f"(last error: {last_error})\n" + self.diagnostics()
                )
            time.sleep(1.0)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"airflow {name} exited with code {proc.returncode}\n" + self.diagnostics()
                )

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM each component's process group and every descendant, then SIGKILL.

        Components run in their own sessions; their groups hold the LocalExecutor
        workers and the log server. Task processes and the training subprocess start
        sessions of their own, so they are found through /proc instead.
        """
        live = [p for p in self.procs.values() if p.poll() is None]
        others = [d for p in live for d in _descendants(p.pid)]
        for proc in live:
            _kill(proc.pid, signal.SIGTERM, group=True)
        for pid, _ in others:
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(proc.pid, signal.SIGKILL, group=True)
                proc.wait(timeout=10)
        for pid, started in others:
            if _start_time(pid) == started:  # still the same process: it ignored SIGTERM
                _kill(pid, signal.SIGKILL)

    # -- HTTP

    def call(self, method: str, path: str, body: Any = None, *, auth: bool = True,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """(status, decoded JSON body) of one request; HTTP errors are returned, not raised."""
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
        """A JWT for the admin user, from the SimpleAuthManager's login endpoint."""
        if self._token is None:
            self._token = self.request(
                "POST", "/auth/token", {"username": USER, "password": self.password},
                expect=201, auth=False,
            )["access_token"]
        return self._token

    # -- diagnostics

    def task_logs(self, run_id: str | None = None) -> list[Path]:
        logs = self.home / "logs" / f"dag_id={DAG_ID}"
        pattern = f"run_id={run_id}/**/*.log" if run_id else "**/*.log"
        return sorted(logs.glob(pattern))

    def diagnostics(self, run_id: str | None = None) -> str:
        parts = []
        for name in COMPONENTS:
            parts.append(f"----- {name} log (tail) -----\n{_tail(self.logs / f'{name}.log')}")
        for path in self.task_logs(run_id):
            parts.append(f"----- task log {path.relative_to(self.home)} (tail) -----\n"
                         + _tail(path, 40))
        return "\n".join(parts)


@pytest.fixture(scope="session")
def airflow_stack(tmp_path_factory: pytest.TempPathFactory):
    """A started, healthy Airflow with ``keras_retrain`` parsed and unpaused."""
    stack = AirflowStack(tmp_path_factory.mktemp("airflow-system"))
    try:
        stack.start()
        stack.wait_ready()
        dag = stack.request("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
        assert dag["is_paused"] is False, dag
        yield stack
    finally:
        stack.stop()
