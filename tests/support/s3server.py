"""A real S3 API over HTTP for tests: moto's standalone server in a child process.

The server runs on a free 127.0.0.1 port, so a test can kill it and start it again
(a cut link without stopping it: ``cutproxy.py``). Dummy credentials go to the server
process and the clients only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

from training.registry.s3 import S3Options

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account id
DUMMY_KEY = "testing-key-id"
DUMMY_SECRET = "testing-secret"


# moto.server's main with werkzeug's run_simple told threaded=False.
SERIALIZED = """
import sys
import moto.server as server
import werkzeug.serving as serving
server.run_simple = lambda *a, **k: serving.run_simple(*a, **{**k, "threaded": False})
server.main(sys.argv[1:])
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MotoServer:
    """moto.server in a child process that tests can kill and restart."""

    def __init__(self, port: int | None = None, *, serialized: bool = False):
        """``serialized``: one request at a time. moto's server is threaded and checks
        a conditional write (If-None-Match, If-Match) and writes in two steps, so
        racing writers can both win there; S3 itself decides atomically."""
        self.serialized = serialized
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> None:
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": DUMMY_KEY,
            "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
            "AWS_DEFAULT_REGION": REGION,
        }
        command = [sys.executable, "-m", "moto.server"]
        if self.serialized:
            command = [sys.executable, "-c", SERIALIZED]
        self.proc = subprocess.Popen(
            [*command, "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
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
        values = {
            "endpoint_url": self.endpoint,
            "region_name": REGION,
            "aws_access_key_id": DUMMY_KEY,
            "aws_secret_access_key": DUMMY_SECRET,
            "addressing_style": "path",
            "max_attempts": 3,
            "connect_timeout_s": 2,
            "read_timeout_s": 10,
            **overrides,
        }
        return S3Options(**values)

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=DUMMY_KEY,
            aws_secret_access_key=DUMMY_SECRET,
        )

    def create_bucket(self) -> str:
        name = f"test-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name
