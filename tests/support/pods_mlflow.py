"""An MLflow tracking server beside the Job's pods, on their network: the team's server.

Why: the pods' network is internal (``support/pods.py``: no route out, and none to the
host), so the server a chief pod logs to must be on it, as a cluster's own server is
reached by a Service name. ``mlflow_beside(pods, image, root)`` runs ``mlflow server``
(the project's Airflow image, which has the full MLflow) as a container on
``pods.network`` with the alias ``mlflow``; its store is a SQLite file in a host
directory. Once the pods have run, ``stop()`` ends the server, and a plain MLflow client
in the test process reads that file (``uri``). The container is removed before the pods'
network is (use it inside the ``JobPods`` block).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PORT = 5000
URL = f"http://mlflow:{PORT}"  # as the pods reach it: the container's network alias


class ServerBeside:
    def __init__(self, pods: Any, image: str, root: Path) -> None:
        self.pods, self.image = pods, image
        self.name = f"{pods.prefix}-mlflow"
        self.data = root / "mlflow-beside"
        self.data.mkdir(parents=True)
        self.data.chmod(0o777)  # the image's user (uid 50000) writes the store here

    @property
    def uri(self) -> str:
        """The store as the test process reads it (after ``stop``)."""
        return f"sqlite:///{self.data / 'mlflow.db'}"

    def start(self, timeout: float = 180.0) -> None:
        docker = self.pods.images.docker
        docker("run", "--detach", "--name", self.name, "--network", self.pods.network,
               "--network-alias", "mlflow", "--label", f"aktpods={self.pods.prefix}",
               "--volume", f"{self.data}:/mlflow",
               "--env", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false",
               "--entrypoint", "python", self.image, "-m", "mlflow", "server",
               "--host", "0.0.0.0", "--port", str(PORT), "--workers", "1",
               "--backend-store-uri", "sqlite:////mlflow/mlflow.db",
               "--artifacts-destination", "/mlflow/artifacts",
               # MLflow 3 answers 403 to a Host header it was not told of
               "--allowed-hosts", f"mlflow:{PORT},127.0.0.1:{PORT}")
        probe = ("import urllib.request; "
                 f"urllib.request.urlopen('http://127.0.0.1:{PORT}/health', timeout=2)")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if docker("exec", self.name, "python", "-c", probe, check=False).returncode == 0:
                return
            time.sleep(1)
        logs = docker("logs", "--tail", "40", self.name, check=False)
        raise RuntimeError(f"mlflow server beside the pods not healthy in {timeout:.0f} s:\n"
                           f"{logs.stdout}{logs.stderr}")

    def stop(self) -> None:
        self.pods.images.docker("stop", "--time", "10", self.name, check=False)

    def remove(self) -> None:
        self.pods.images.docker("rm", "--force", self.name, check=False)


@contextlib.contextmanager
def mlflow_beside(pods: Any, image: str, root: Path) -> Iterator[ServerBeside]:
    server = ServerBeside(pods, image, root)
    try:
        server.start()
        yield server
    finally:
        server.remove()
