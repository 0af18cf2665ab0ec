"""A Docker engine of the project's own: ``dockerd`` as a local process, and its client.

The images are built and run by a real engine (Debian's ``docker.io``: dockerd 20.10,
containerd, runc), started here as root with its data, sockets and log under one
directory, so that nothing is shared with an engine the machine may already run. It
listens on a unix socket only; ``--bridge=none --iptables=false`` leave the host's
network alone: the networks the tests create are their own, each with an explicit subnet.
When ``DOCKER_HOST`` is set, that engine is used instead and nothing is started.

``DockerEngine`` is a ``services.Service`` (start until it answers, stop, kill), like the
production stack's servers; ``docker()`` runs the client against it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from tools.services import Service, ServiceError, find_binary

# What is kept between runs by its inputs: the engine's images, bases, the wheelhouse.
CACHE = Path(os.environ.get("TRAINING_CACHE_DIR")
             or Path.home() / ".cache" / "airflow-keras-training")


def docker_client() -> str:
    """Debian's ``docker`` client (BuildKit built in), else the first on PATH."""
    debian = "/usr/bin/docker"
    if os.access(debian, os.X_OK):
        return debian
    found = shutil.which("docker")
    if not found:
        raise ServiceError("docker is not installed: install Debian's docker.io "
                           "(apt-get install -y docker.io)")
    return found


class DockerEngine(Service):
    """``dockerd`` on ``<root>/docker.sock``, its images and containers under ``root``."""

    name = "dockerd"

    def __init__(self, root: Path = CACHE / "engine") -> None:
        super().__init__(root, port=0)
        self.socket = self.root / "docker.sock"
        self.host = os.environ.get("DOCKER_HOST") or f"unix://{self.socket}"
        self.external = "DOCKER_HOST" in os.environ  # someone else's engine: never started
        self.started = False

    @property
    def env(self) -> dict[str, str]:
        """What a client needs: this engine's socket, BuildKit on."""
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "1"}

    def command(self) -> list[str]:
        binary = find_binary("dockerd", "/usr/sbin/dockerd", package="docker.io")
        return [binary, "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "exec"), "-H", self.host,
                "--pidfile", str(self.root / "dockerd.pid"),
                "--bridge=none", "--iptables=false", "--ip6tables=false"]

    def ready(self) -> bool:
        return self.docker("version", "--format", "{{.Server.Version}}", check=False,
                           timeout=10).returncode == 0

    def ensure(self) -> DockerEngine:
        """Start the engine unless one already answers on its socket."""
        if not self.ready():
            if self.external:
                raise ServiceError(f"no Docker engine answers on DOCKER_HOST={self.host}")
            self.start(timeout=60)
            self.started = True
        return self

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the engine if this object started it (containers left are stopped too)."""
        if self.started:
            super().stop(grace_s)
            self.started = False

    def docker(self, *args: str, check: bool = True, capture: bool = True,
               timeout: float | None = None, env: Mapping[str, str] | None = None,
               cwd: Path | str | None = None, stdin: IO[bytes] | None = None,
               ) -> subprocess.CompletedProcess:
        """``docker ARGS`` against this engine; ``check`` raises with the client's output."""
        try:
            done = subprocess.run([docker_client(), *args], env={**self.env, **(env or {})},
                                  capture_output=capture, text=True, timeout=timeout,
                                  cwd=cwd, stdin=stdin)
        except subprocess.TimeoutExpired as exc:
            raise ServiceError(f"docker {' '.join(args[:3])} ... took over {timeout} s") \
                from exc
        if check and done.returncode != 0:
            output = ((done.stdout or "") + (done.stderr or "")).strip()
            raise ServiceError(f"docker {' '.join(args[:3])} ... exited with "
                               f"{done.returncode}:\n{output[-3000:]}")
        return done

    def has_image(self, tag: str) -> bool:
        return self.docker("image", "inspect", tag, check=False).returncode == 0
