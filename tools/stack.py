"""``./dev stack``: the production configuration on one machine, as plain processes.

What ``docker/compose.yaml`` deploys, for a team to try before it deploys and for the
tests: PostgreSQL (Airflow's database and Celery's result backend), Redis (the broker,
with a password), SeaweedFS (the S3 model store: a bucket and a store identity limited
to it; Airflow never holds the S3 admin key), the api-server, scheduler, dag-processor
and triggerer with the CeleryExecutor, and two Celery workers: one on the ``default``
queue and one on the ``gpu`` queue (one task at a time; the CPU stands in for the GPU
here), where the cluster policy sends ``train`` of a run triggered with
``accelerator: gpu``. ``--default-workers N`` (or ``TRAINING_STACK_DEFAULT_WORKERS``)
runs N workers on the default queue instead of one, sharing its concurrency, as a
deployment scaled out to N machines (a sweep's trials then train on several workers).

- Everything lives in ``.stack/`` (not committed): ``secrets.env`` (generated on first
  start: the database and broker passwords, the S3 keys, the Fernet, API and JWT keys;
  the names ``docker/.env`` uses), each server's data, ``airflow/`` (AIRFLOW_HOME),
  ``data/`` (the training data directory every worker shares) and ``logs/``, one log a
  process.
- Airflow gets the same settings as in ``docker/compose.yaml``: ``AIRFLOW__...`` variables,
  the store connection as ``AIRFLOW_CONN_AWS_DEFAULT``. A setting in the environment wins
  (Airflow's rule); ``--port`` wins over the environment and moves every port: the UI on
  P, log servers on P+1 (default worker), P+2 (triggerer), P+3 (gpu worker), PostgreSQL
  on P+4, Redis on P+5, S3 on P+6, SeaweedFS's own servers on P+7 to P+15 and MLflow's
  tracking server on P+16; default worker N (from 2) has its log server on P+15+N.
- MLflow's tracking server (``tools/mlflow_server.py``): its backend store the database
  ``mlflow`` of the same PostgreSQL, its artifacts in the bucket (``mlflow/``); every
  Airflow component gets it as ``TRAINING_MLFLOW_TRACKING_URI`` (docs/tracking.md).
- PostgreSQL holds a second database, ``optuna``, owned by Airflow's role: the sweeps'
  Optuna studies. Every Airflow component gets it as ``TRAINING_SWEEP_STORAGE`` (a URL
  without the password) and the role's password as ``TRAINING_SWEEP_STORAGE_PASSWORD``,
  as compose passes them (docs/sweeps.md).
- Before Airflow starts, ``training_airflow.preflight`` checks the database, the broker
  and the store with those settings: a wrong one stops the stack with one line that
  names it.
- A process that dies is started again (compose's ``restart: unless-stopped``), at most
  ``MAX_RESTARTS`` times; Ctrl-C (or SIGTERM) stops everything the stack started and
  nothing else.

Over 300 lines on purpose, and why: the settings every component shares, the order the
services start in and what each is handed are one picture of the deployment, read
beside ``docker/compose.yaml`` in one file.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tools.mlflow_server import MlflowServer
from tools.seaweedfs import S3Identity, SeaweedFS
from tools.services import HOST, PostgreSQL, Redis, Service, ServiceError
from tools.standalone import Stack, component_env, login_password, wait_ready
from training_airflow import preflight

ROOT = Path(__file__).resolve().parents[1]
SECRETS = ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "S3_ADMIN_ACCESS_KEY",
           "S3_ADMIN_SECRET_KEY", "STORE_ACCESS_KEY", "STORE_SECRET_KEY",
           "AIRFLOW_FERNET_KEY", "AIRFLOW_API_SECRET_KEY", "AIRFLOW_JWT_SECRET")
PORTS = {"api": 0, "worker_log": 1, "trigger_log": 2, "gpu_worker_log": 3,
         "postgres": 4, "redis": 5, "s3": 6}
PORTS["mlflow"] = PORTS["s3"] + len(SeaweedFS.PORTS)  # after SeaweedFS's own servers
SPAN = PORTS["mlflow"] + 1
MAX_RESTARTS = 5
MAX_DEFAULT_WORKERS = 8
DAG_ID = "keras_retrain"
SWEEP_DATABASE = "optuna"  # the sweeps' Optuna studies, beside Airflow's database
MLFLOW_DATABASE = "mlflow"  # the MLflow tracking server's backend store


def span(default_workers: int = 1) -> int:
    """How many ports from P the stack uses: SPAN, and one more for each default worker
    past the first (its log server, after SeaweedFS's)."""
    return SPAN + default_workers - 1


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _read_from(path: Path, offset: int) -> bytes:
    if not path.exists():
        return b""
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read()


def load_secrets(path: Path) -> dict[str, str]:
    """The stack's secrets; the missing ones generated and written (mode 0600)."""
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith("#"):
                values[key.strip()] = value.strip()
    missing = [name for name in SECRETS if not values.get(name)]
    if missing:
        from cryptography.fernet import Fernet

        for name in missing:
            values[name] = (Fernet.generate_key().decode() if name == "AIRFLOW_FERNET_KEY"
                            else secrets.token_hex(8) if name.endswith("ACCESS_KEY")
                            else secrets.token_urlsafe(24))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# ./dev stack's secrets, generated on first start (never commit)\n"
                        + "".join(f"{name}={values[name]}\n" for name in SECRETS))
        path.chmod(0o600)
    return values


class ProductionStack:
    """The servers and Airflow's processes of ``./dev stack`` under ``root``."""

    def __init__(self, root: Path, env: Mapping[str, str], port: int | None,
                 host: str | None, default_workers: int = 1) -> None:
        if not 1 <= default_workers <= MAX_DEFAULT_WORKERS:
            raise ValueError(f"the default workers must be between 1 and "
                             f"{MAX_DEFAULT_WORKERS}, got {default_workers}")
        self.root, self.default_workers = root, default_workers
        self.logs = root / "logs"
        raw = env.get("AIRFLOW__API__PORT") or "8080"
        if port is None and not raw.isdigit():
            raise ValueError(f"AIRFLOW__API__PORT must be a port number, got {raw!r}")
        base = port or int(raw)
        self.ports = {name: base + offset for name, offset in PORTS.items()}
        self.ports.update({f"worker-{n}_log": base + SPAN + n - 2
                           for n in range(2, default_workers + 1)})
        self.secrets = s = load_secrets(root / "secrets.env")
        self.bucket = env.get("TRAINING_BUCKET", "models")
        self.store_identity = S3Identity("store", s["STORE_ACCESS_KEY"],
                                         s["STORE_SECRET_KEY"], (self.bucket,))
        self.postgres = PostgreSQL(root / "postgres", self.ports["postgres"],
                                   password=s["POSTGRES_PASSWORD"],
                                   databases=(SWEEP_DATABASE, MLFLOW_DATABASE))
        self.redis = Redis(root / "redis", self.ports["redis"], password=s["REDIS_PASSWORD"])
        self.seaweedfs = SeaweedFS(
            root / "seaweedfs", self.ports["s3"],
            [S3Identity("admin", s["S3_ADMIN_ACCESS_KEY"], s["S3_ADMIN_SECRET_KEY"]),
             self.store_identity], buckets=[self.bucket])
        pg = self.postgres
        # MLflow's server: its store a database of the stack's PostgreSQL, named without
        # the password (PGPASSWORD reaches the driver), its artifacts in the bucket.
        self.mlflow = MlflowServer(
            root / "mlflow", self.ports["mlflow"],
            backend=f"postgresql+psycopg2://{pg.user}@{HOST}:{pg.port}/{MLFLOW_DATABASE}",
            artifacts=f"s3://{self.bucket}/mlflow",
            env={"PGPASSWORD": pg.password, "MLFLOW_S3_ENDPOINT_URL": self.seaweedfs.endpoint,
                 "AWS_ACCESS_KEY_ID": self.store_identity.access_key,
                 "AWS_SECRET_ACCESS_KEY": self.store_identity.secret_key,
                 "AWS_DEFAULT_REGION": SeaweedFS.REGION})
        self.services: dict[str, Service] = {"postgres": self.postgres, "redis": self.redis,
                                             "seaweedfs": self.seaweedfs,
                                             "mlflow": self.mlflow}
        for name, service in self.services.items():
            service.log = self.logs / f"{name}.log"
        self.env = component_env({**self.defaults(), **env}, host, port)
        log_ports = {"worker-gpu": self.ports["gpu_worker_log"],
                     **{name: self.ports[f"{name}_log"] for name in self.worker_names()}}
        self.airflow = Stack(self.env, self.logs, commands=self.commands(), envs={
            name: {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_port)}
            for name, log_port in log_ports.items()})
        self.restarts: dict[str, int] = {}

    def defaults(self) -> dict[str, str]:
        """Airflow's and the project's settings, as docker/compose.yaml passes them."""
        s, pg = self.secrets, self.postgres
        return {
            "AIRFLOW_HOME": os.fspath(self.root / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": os.fspath(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": os.fspath(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__FERNET_KEY": s["AIRFLOW_FERNET_KEY"],
            "AIRFLOW__API__SECRET_KEY": s["AIRFLOW_API_SECRET_KEY"],
            "AIRFLOW__API_AUTH__JWT_SECRET": s["AIRFLOW_JWT_SECRET"],
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": pg.url,
            # psycopg2 by name: a bare db+postgresql:// picks psycopg 3 under SQLAlchemy 2.1
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + pg.url,
            "AIRFLOW__CELERY__BROKER_URL": self.redis.url,
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "true",
            # A worker that dies with its tasks (a lost machine) is noticed in a minute
            # rather than Airflow's default five, and the task goes to its retries.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(self.seaweedfs.connection(self.store_identity)),
            "TRAINING_DATA_DIR": os.fspath(self.root / "data"),
            "TRAINING_STORE_URI": f"s3://{self.bucket}/registry",
            "TRAINING_AWS_CONN_ID": "aws_default",
            "TRAINING_GPU_QUEUE": "gpu",
            "TRAINING_SCHEDULE": "",
            # The sweeps' studies: the URL names no password; the driver gets it apart.
            "TRAINING_SWEEP_STORAGE": (f"postgresql+psycopg2://{pg.user}@{HOST}:{pg.port}/"
                                       f"{SWEEP_DATABASE}"),
            "TRAINING_SWEEP_STORAGE_PASSWORD": pg.password,
            # Every run, trial and version in the stack's MLflow server (docs/tracking.md).
            "TRAINING_MLFLOW_TRACKING_URI": self.mlflow.url,
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }

    def worker_names(self) -> list[str]:
        """The default queue's workers: ``worker``, then ``worker-2`` ... (their logs)."""
        return ["worker", *(f"worker-{n}" for n in range(2, self.default_workers + 1))]

    def commands(self) -> dict[str, list[str]]:
        gpu_queue = self.env.get("TRAINING_GPU_QUEUE", "gpu")
        # The default queue's concurrency (the CPU count), shared by its workers.
        each = str(max(1, max(2, os.cpu_count() or 2) // self.default_workers))
        return {
            "api-server": ["api-server"], "scheduler": ["scheduler"],
            "dag-processor": ["dag-processor"], "triggerer": ["triggerer"],
            **{name: ["celery", "worker", "--queues", "default", "--concurrency", each,
                      "--celery-hostname", name.replace("worker", "default", 1) + "@%h"]
               for name in self.worker_names()},
            "worker-gpu": ["celery", "worker", "--queues", gpu_queue, "--concurrency", "1",
                           "--celery-hostname", f"{gpu_queue}@%h"],
        }

    @property
    def base_url(self) -> str:
        return self.env["AIRFLOW__API__BASE_URL"]

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        for service in self.services.values():
            if service is not self.mlflow:
                service.start()
        for line in preflight.check(self.env):
            print(f"  ok: {line}", flush=True)
        self.mlflow.start()  # after the checks: a wrong setting stops the stack sooner
        self.migrate()
        # The logs are appended to across starts: only what this start writes counts.
        seen = {name: _size(self.logs / f"{name}.log")
                for name in (*self.worker_names(), "worker-gpu")}
        self.airflow.start()
        wait_ready(self.airflow, self.base_url)
        self.wait_workers(seen)

    def migrate(self) -> None:
        log = self.logs / "db-migrate.log"
        with open(log, "wb") as out:
            done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"],
                                  env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ServiceError(f"airflow db migrate failed (exit {done.returncode}); log: {log}")

    def wait_workers(self, seen: Mapping[str, int], timeout: float = 180.0) -> None:
        """Until each Celery worker says it is ready (a ``ready.`` line its log gained
        after the first ``seen[name]`` bytes)."""
        deadline = time.monotonic() + timeout
        for name, offset in seen.items():
            log = self.logs / f"{name}.log"
            while b" ready." not in _read_from(log, offset):
                if self.airflow.procs[name].poll() is not None or time.monotonic() > deadline:
                    raise ServiceError(f"Celery {name} did not become ready; log: {log}")
                time.sleep(0.5)

    def watch(self) -> None:
        """Start again whatever died, until Ctrl-C; give up after MAX_RESTARTS of one."""
        while True:
            for name, service in self.services.items():
                if not service.alive():
                    self._restarting(name, service.proc.returncode if service.proc else None)
                    service.start()
            for name, proc in list(self.airflow.procs.items()):
                if proc.poll() is not None:
                    self._restarting(name, proc.returncode)
                    self.airflow.restart(name)
            time.sleep(1.0)

    def _restarting(self, name: str, code: int | None) -> None:
        self.restarts[name] = self.restarts.get(name, 0) + 1
        if self.restarts[name] > MAX_RESTARTS:
            raise ServiceError(f"{name} exited {MAX_RESTARTS + 1} times; giving up "
                               f"(log: {self.logs / name}.log)")
        print(f"{name} exited with code {code}; starting it again "
              f"({self.restarts[name]} of {MAX_RESTARTS})", flush=True)

    def stop(self) -> None:
        self.airflow.stop()
        for service in reversed(list(self.services.values())):
            service.stop()

    def banner(self) -> str:
        pg, redis = self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], \
            self.env["AIRFLOW__CELERY__BROKER_URL"]
        home = Path(self.env["AIRFLOW_HOME"])
        return "\n".join([
            "",
            f"The production stack is ready: {self.base_url}/",
            f"  login:      admin / {login_password(home)}",
            f"  DAG:        {self.base_url}/dags/{DAG_ID} (trigger with accelerator gpu: "
            "train runs on the gpu-queue worker)",
            f"  workers:    {', '.join(self.worker_names())} on the default queue, "
            "worker-gpu on the gpu queue",
            f"  Models:     {self.base_url}/models/",
            f"  store:      {self.env['TRAINING_STORE_URI']} on {self.seaweedfs.endpoint} "
            "(SeaweedFS; keys in secrets.env)",
            f"  database:   {preflight.masked(pg)}",
            f"  sweeps:     {self.env['TRAINING_SWEEP_STORAGE'] or 'SQLite under the runs'} "
            "(Optuna studies; password: TRAINING_SWEEP_STORAGE_PASSWORD)",
            f"  broker:     {preflight.masked(redis)}",
            f"  MLflow:     {self.mlflow.url}/ (runs, trials, models:/<name>@champion; "
            f"store: the database {MLFLOW_DATABASE}, artifacts: s3://{self.bucket}/mlflow)",
            f"  secrets:    {self.root / 'secrets.env'}",
            f"  logs:       {self.logs}/<process>.log, task logs in {home}/logs/",
            "Stop with Ctrl-C.",
            "",
        ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./dev stack", allow_abbrev=False,
        description="The production configuration on one machine: PostgreSQL, Redis, "
                    "SeaweedFS, Airflow with the CeleryExecutor, a default and a gpu worker.")
    parser.add_argument("--port", type=int,
                        help=f"UI port; the stack uses P to P+{SPAN - 1}, and one more a "
                             "default worker past the first (default: "
                             "AIRFLOW__API__PORT, else 8080); wins over the environment")
    parser.add_argument("--host", help="address the UI listens on (default 127.0.0.1)")
    parser.add_argument("--default-workers", type=int, metavar="N",
                        help="Celery workers on the default queue, sharing its concurrency "
                             "(default: TRAINING_STACK_DEFAULT_WORKERS, else 1; "
                             f"at most {MAX_DEFAULT_WORKERS}); worker N's log server on "
                             f"P+{SPAN - 2}+N")
    args = parser.parse_args(argv)
    workers = args.default_workers
    if workers is None:
        raw = os.environ.get("TRAINING_STACK_DEFAULT_WORKERS") or "1"
        if not raw.isdigit():
            parser.error(f"TRAINING_STACK_DEFAULT_WORKERS must be a whole number, got {raw!r}")
        workers = int(raw)
    if not 1 <= workers <= MAX_DEFAULT_WORKERS:
        parser.error(f"--default-workers must be between 1 and {MAX_DEFAULT_WORKERS}, "
                     f"got {workers}")
    last = 65535 - span(workers)
    if args.port is not None and not 1024 <= args.port <= last:
        parser.error(f"--port must be between 1024 and {last}, got {args.port}")
    root = Path(os.environ.get("TRAINING_STACK_DIR") or ROOT / ".stack")
    try:
        stack = ProductionStack(root, os.environ, args.port, args.host, workers)
    except (ValueError, ServiceError) as exc:
        parser.error(str(exc))

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"starting the production stack in {root} (logs: {stack.logs}) ...", flush=True)
    try:
        stack.start()
        print(stack.banner(), flush=True)
        stack.watch()
    except KeyboardInterrupt:
        print("stopping the production stack ...", flush=True)
        return 0
    except (preflight.PreflightError, ServiceError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except SystemExit as exc:  # wait_ready: a component died or never became ready
        print(exc, file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
