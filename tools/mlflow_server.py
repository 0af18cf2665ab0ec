"""MLflow's tracking server as a local process, for ./dev stack, ./dev mlflow and the tests.

``MlflowServer`` runs ``mlflow server`` (the lock's MLflow) on 127.0.0.1: its backend
store a SQLite file under its directory, or a database of the stack's PostgreSQL given
as a URL without a password (the password reaches psycopg2 as ``PGPASSWORD`` in the
server's environment, never in a URL that its log or ``ps`` would show); its artifacts
(the reports, sweep.json) under its directory or in an ``s3://`` bucket of the stack's
SeaweedFS, proxied by the server (``--artifacts-destination``), so clients need no
credentials for them. MLflow's job executor (a huey consumer this pipeline does not
use) is off: it doubled the start-up time here.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tools.services import HOST, Service

MLFLOW = Path(sys.executable).with_name("mlflow")


class MlflowServer(Service):
    """``mlflow server`` on ``port``; ``url`` is its tracking URI."""

    name = "mlflow"

    def __init__(self, root: Path, port: int, *, backend: str = "", artifacts: str = "",
                 env: Mapping[str, str] | None = None) -> None:
        super().__init__(root, port)
        self.backend = backend or f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"
        self.artifacts = artifacts or os.fspath(Path(root).resolve() / "artifacts")
        self.env = dict(env or {})

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return [os.fspath(MLFLOW), "server", "--host", HOST, "--port", str(self.port),
                "--workers", "1", "--backend-store-uri", self.backend,
                "--artifacts-destination", self.artifacts]

    def prepare(self) -> None:
        if "MLFLOW_S3_ENDPOINT_URL" in self.env:  # SeaweedFS on 127.0.0.1: path-style
            config = self.root / "aws-config"
            config.write_text("[default]\ns3 =\n    addressing_style = path\n")
            self.env.setdefault("AWS_CONFIG_FILE", str(config))

    def popen_options(self) -> dict:
        return {"env": {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                        **self.env}}

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def start(self, timeout: float = 180.0) -> None:  # migrations on a new store: ~30 s
        super().start(timeout)
