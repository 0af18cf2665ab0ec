"""The tests' S3 server: SeaweedFS (``weed mini``, ``tools/services.py``) in a child process.

A real S3 implementation, the one ``./dev stack`` runs: it checks every request's
signature (a wrong secret is ``SignatureDoesNotMatch``), limits an identity to its
buckets (``AccessDenied`` elsewhere), decides a conditional write (If-None-Match,
If-Match) atomically (seaweedfs/seaweedfs#8801, in since 4.17) and keeps its objects on
disk, so a test can kill it and start it again on the same data (a cut link without
stopping it: ``cutproxy.py``).

Each server has two identities, their keys made up for it: ``admin`` (creates the
buckets) and ``team``, limited to the buckets named ``test-*`` the way a store identity
of the stack is limited to its bucket; ``options()`` and ``connection()`` are the team's.
The keys go to the server's config file and the clients only.

``MotoServer`` (moto's standalone server) is left for ``bench/publishing.py`` only.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from tools.seaweedfs import S3Identity, SeaweedFS
from tools.services import ServiceError, free_port_block
from training.registry.s3 import S3Options

REGION = SeaweedFS.REGION
BUCKET_PREFIX = "test-"
# A bucket a test, each written to taking a volume: far more than a session makes, never
# weed mini's count from free disk space (tools/seaweedfs.py)
VOLUMES = 2000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _identity(name: str, buckets: tuple[str, ...] | None = None) -> S3Identity:
    return S3Identity(name, f"{name.upper()}{secrets.token_hex(8).upper()}",
                      secrets.token_urlsafe(24), buckets)


class S3Server:
    """SeaweedFS on 127.0.0.1 with its data under ``root``: start, kill, start again."""

    START_TRIES = 3  # ``free_port_block`` guesses; another process may take a port first

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="s3server-"))
        self.admin = _identity("admin")
        self.team = _identity("team", (f"{BUCKET_PREFIX}*",))
        self.service: SeaweedFS | None = None

    def _new_service(self, attempt: int) -> SeaweedFS:
        return SeaweedFS(self.root / f"seaweedfs-{attempt}",
                         free_port_block(len(SeaweedFS.PORTS)), [self.admin, self.team],
                         volumes=VOLUMES)

    def start(self) -> None:
        """Start the server; after ``kill`` (or ``stop``), again on the same port and data."""
        if self.service is not None:
            self.service.start()
            return
        for attempt in range(self.START_TRIES):
            service = self._new_service(attempt)
            try:
                service.start()
            except ServiceError:
                service.kill()
                if attempt == self.START_TRIES - 1:
                    raise
                continue
            self.service = service
            return

    def _running(self) -> SeaweedFS:
        if self.service is None:
            raise RuntimeError("the S3 server was never started")
        return self.service

    @property
    def port(self) -> int:
        return self._running().port

    @property
    def endpoint(self) -> str:
        return self._running().endpoint

    def kill(self) -> None:
        """SIGKILL: a crash. The data written so far stays for the next ``start``."""
        if self.service is not None:
            self.service.kill()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop(grace_s=10)

    def options(self, identity: S3Identity | None = None, **overrides) -> S3Options:
        """The S3Options of ``identity`` (the team's by default)."""
        identity = identity or self.team
        values = {
            "endpoint_url": self.endpoint,
            "region_name": REGION,
            "aws_access_key_id": identity.access_key,
            "aws_secret_access_key": identity.secret_key,
            "addressing_style": "path",
            "max_attempts": 3,
            "connect_timeout_s": 2,
            "read_timeout_s": 10,
            **overrides,
        }
        return S3Options(**values)

    def client(self, identity: S3Identity | None = None):
        """A boto3 client of ``identity`` (the admin by default), behind any store's back."""
        return self._running().client(identity or self.admin)

    def connection(self, identity: S3Identity | None = None) -> dict:
        """The Airflow ``aws`` connection (``AIRFLOW_CONN_...`` JSON) of the team."""
        return dict(self._running().connection(identity or self.team))

    def env(self, identity: S3Identity | None = None, endpoint: str | None = None) -> dict:
        """``AWS_*`` variables for a subprocess that reaches the server (or ``endpoint``,
        a proxy in front of it) as ``identity`` (the team by default); path-style
        addressing needs an ``AWS_CONFIG_FILE`` besides, see the callers."""
        identity = identity or self.team
        return {"AWS_ENDPOINT_URL_S3": endpoint or self.endpoint,
                "AWS_ACCESS_KEY_ID": identity.access_key,
                "AWS_SECRET_ACCESS_KEY": identity.secret_key,
                "AWS_DEFAULT_REGION": REGION}

    def create_bucket(self) -> str:
        """A new, empty bucket that the team may use."""
        name = f"{BUCKET_PREFIX}{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name


class MotoServer:
    """moto's standalone server in a child process: no test uses it any more.

    Kept for ``bench/publishing.py``, which imports it and whose number in
    ``docs/benchmarks.md`` (5) was measured on it; moved to ``S3Server`` (and measured
    again) it no longer needs it, nor the dev dependency ``moto[server]``. Any keys
    pass here: moto checks no signature."""

    KEY, SECRET = "testing-key-id", "testing-secret"

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> None:
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.KEY,
               "AWS_SECRET_ACCESS_KEY": self.SECRET, "AWS_DEFAULT_REGION": REGION}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode} at start")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"moto server did not answer on {self.endpoint}") from None
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def options(self, **overrides) -> S3Options:
        values = {"endpoint_url": self.endpoint, "region_name": REGION,
                  "aws_access_key_id": self.KEY, "aws_secret_access_key": self.SECRET,
                  "addressing_style": "path", "max_attempts": 3, "connect_timeout_s": 2,
                  "read_timeout_s": 10, **overrides}
        return S3Options(**values)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.KEY, aws_secret_access_key=self.SECRET)

    def create_bucket(self) -> str:
        name = f"{BUCKET_PREFIX}{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name
