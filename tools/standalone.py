"""``python -m tools.standalone``: the local Airflow behind ``./dev airflow``.

What ``airflow standalone`` does, made dependable for this project on a small machine:

- the components (api-server, scheduler, dag-processor, triggerer) run as
  ``python -m airflow ...`` with this interpreter, so nothing depends on ``airflow``
  being on ``PATH`` (``airflow standalone`` looks it up there and hangs without it);
- one ``--port`` moves everything that goes with it: the UI and REST API on ``port``,
  the execution API that task processes call (``http://HOST:port/execution/``), the
  worker log server on ``port + 1`` and the triggerer's log server on ``port + 2``;
- ``parallelism`` is the number of CPUs (LocalExecutor otherwise starts 32 workers);
- the ready banner comes when the UI answers and the scheduler and dag-processor
  report healthy, and it says where to go and how to log in (SimpleAuthManager's
  ``admin`` user and the password it generated in ``$AIRFLOW_HOME``);
- each component's output goes to ``$AIRFLOW_HOME/logs/standalone/<component>.log``;
  when one dies, its last lines are printed and the others are stopped.

Ctrl-C (SIGINT) or SIGTERM stops every component and the tasks they started.
The caller (``./dev airflow``) sets ``AIRFLOW_HOME``, the DAG and plugin folders and
the training data directory, and has migrated the database.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
STARTUP_TIMEOUT_S = 300.0
USER = "admin"
DAG_ID = "keras_retrain"


def component_env(env: Mapping[str, str], host: str | None = None, port: int | None = None,
                  ) -> dict[str, str]:
    """The environment of every component: ports, URLs and sizes for one local machine.

    An ``AIRFLOW__...`` setting in ``env`` wins over the default here (Airflow's own
    rule: the environment overrides the configuration); ``host`` and ``port``, when given
    (``--host``, ``--port``), win over the environment and move everything that goes with
    them. Without ``--port`` the port is ``AIRFLOW__API__PORT`` or 8080.
    """
    if not port and not (env.get("AIRFLOW__API__PORT") or "8080").isdigit():
        raise ValueError("AIRFLOW__API__PORT must be a port number, got "
                         f"{env['AIRFLOW__API__PORT']!r}")
    effective_port = port or int(env.get("AIRFLOW__API__PORT") or 8080)
    effective_host = host or env.get("AIRFLOW__API__HOST") or "127.0.0.1"
    url_host = "127.0.0.1" if effective_host in ("0.0.0.0", "::") else effective_host
    base_url = f"http://{url_host}:{effective_port}"
    defaults = {
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__PARALLELISM": str(max(2, os.cpu_count() or 2)),
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",  # late answers while training
        "AIRFLOW__API__HOST": effective_host,
        "AIRFLOW__API__PORT": str(effective_port),
    }
    by_port = {
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(effective_port + 1),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(effective_port + 2),
    }
    urls = {
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
    }
    forced = {
        **({"AIRFLOW__API__PORT": str(port), **by_port} if port else {}),
        **({"AIRFLOW__API__HOST": host} if host else {}),
        **(urls if port or host else {}),
    }
    venv_bin = os.fspath(Path(sys.executable).parent)
    return {
        **defaults, **by_port, **urls, **env, **forced,
        # Anything that still looks `airflow` up finds this environment's.
        "PATH": venv_bin + os.pathsep + env.get("PATH", os.defpath),
        "PYTHONUNBUFFERED": "1",
    }


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Stack:
    """The component processes, each in its own process group, logging to a file.
    ``commands``: each one's ``airflow`` arguments by name (default: the four components);
    ``envs``: what one's environment adds to ``env`` (a Celery worker's log port)."""

    def __init__(self, env: dict[str, str], log_dir: Path,
                 commands: Mapping[str, Sequence[str]] | None = None,
                 envs: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.env, self.log_dir = env, log_dir
        self.commands = dict(commands or {name: [name] for name in COMPONENTS})
        self.envs = dict(envs or {})
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in self.commands:
            self.restart(name)

    def restart(self, name: str) -> None:
        """Start component ``name`` (again, once its process has exited)."""
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", *self.commands[name]],
                env={**self.env, **self.envs.get(name, {})},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def dead(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                return name
        return None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM each component's group and every descendant, then SIGKILL what is left.

        Task processes and the training subprocess run in sessions of their own, so
        they are found through ``/proc`` rather than through the groups.
        """
        live = [p for p in self.procs.values() if p.poll() is None]
        others = [(pid, _start_time(pid)) for p in live for pid in descendants(p.pid)]
        for proc in live:
            _signal_group(proc.pid, signal.SIGTERM)
        for pid, _ in others:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for pid, started in others:
            if started is not None and _start_time(pid) == started:  # not a new process
                _signal(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a process from a later one with its pid)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else []:
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def wait_ready(stack: Stack, base_url: str, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Until the api-server answers and scheduler and dag-processor are healthy."""
    deadline = time.monotonic() + timeout
    while True:
        dead = stack.dead()
        if dead:
            log = stack.log_dir / f"{dead}.log"
            raise SystemExit(f"error: airflow {dead} exited with code "
                             f"{stack.procs[dead].returncode}; last lines of {log}:\n"
                             + log_tail(log))
        try:
            health = _get_json(f"{base_url}/api/v2/monitor/health")
            if all(health.get(c, {}).get("status") == "healthy"
                   for c in ("metadatabase", "scheduler", "dag_processor")):
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"error: Airflow did not become ready in {timeout:.0f} s; "
                             f"component logs in {stack.log_dir}")
        time.sleep(1.0)


def login_password(home: Path) -> str:
    """The admin password SimpleAuthManager generated (it writes it on first start)."""
    path = home / "simple_auth_manager_passwords.json.generated"
    for _ in range(30):
        try:
            return json.loads(path.read_text())[USER]
        except (OSError, ValueError, KeyError):
            time.sleep(1.0)
    return f"(see {path})"


def banner(base_url: str, home: Path, log_dir: Path) -> str:
    schedule = os.environ.get("TRAINING_SCHEDULE", "0 3 * * *")
    when = (f"nightly schedule {schedule!r} or landed data, once unpaused" if schedule
            else "no nightly schedule: runs start from the Trigger form or when "
                 "land_labelled_data lands a partition")
    return "\n".join([
        "",
        f"Airflow is ready: {base_url}/",
        f"  login:      {USER} / {login_password(home)}",
        f"  DAG:        {base_url}/dags/{DAG_ID} (starts paused; Trigger unpauses it; {when})",
        f"  Models:     {base_url}/models/",
        f"  logs:       {log_dir}/<component>.log, task logs in {home}/logs/",
        "Stop with Ctrl-C.",
        "",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./dev airflow", allow_abbrev=False,
        description="A local Airflow (api-server, scheduler, dag-processor, triggerer; "
                    "LocalExecutor) with the project's DAGs and plugins.")
    parser.add_argument("--port", type=int,
                        help="UI and API port; the log servers use the next two (default: "
                             "AIRFLOW__API__PORT, else 8080); wins over the environment")
    parser.add_argument("--host",
                        help="address the UI listens on (default: AIRFLOW__API__HOST, else "
                             "127.0.0.1; 0.0.0.0 for all); wins over the environment")
    args = parser.parse_args(argv)
    if args.port is not None and not 1024 <= args.port <= 65533:
        parser.error(f"--port must be between 1024 and 65533, got {args.port}")
    home = Path(os.environ["AIRFLOW_HOME"])
    try:
        env = component_env(os.environ, args.host, args.port)
    except ValueError as exc:
        parser.error(str(exc))
    stack = Stack(env, home / "logs" / "standalone")

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"starting Airflow on {env['AIRFLOW__API__BASE_URL']} (component logs: "
          f"{stack.log_dir}) ...", flush=True)
    try:
        stack.start()
        wait_ready(stack, env["AIRFLOW__API__BASE_URL"])
        print(banner(env["AIRFLOW__API__BASE_URL"], home, stack.log_dir), flush=True)
        while (dead := stack.dead()) is None:
            time.sleep(1.0)
        log = stack.log_dir / f"{dead}.log"
        print(f"error: airflow {dead} exited with code {stack.procs[dead].returncode}; "
              f"last lines of {log}:\n{log_tail(log)}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("stopping Airflow ...", flush=True)
        return 0
    finally:
        # A second Ctrl-C must not abandon the components half-stopped.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
