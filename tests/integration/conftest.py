"""Real S3 over HTTP for the integration tests: moto's standalone server in a subprocess.

The server is a child process on a free 127.0.0.1 port, so a test can stop it
(SIGSTOP), resume it (SIGCONT) or kill it. Dummy credentials go to the subprocess and
to the clients only; the test process environment is left alone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from training.storage import FileStore, S3Options, S3Store

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account id
DUMMY_KEY = "testing-key-id"
DUMMY_SECRET = "testing-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MotoServer:
    """moto.server in a child process that tests can pause, resume, kill and restart."""

    def __init__(self, port: int | None = None):
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
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
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

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
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


@pytest.fixture(scope="session")
def moto_server():
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def s3_endpoint(moto_server) -> str:
    return moto_server.endpoint


@pytest.fixture
def fresh_moto_server():
    """A second server, private to one test, that the test may kill and restart."""
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def bucket(moto_server) -> str:
    """A fresh, empty bucket on the session's server."""
    return moto_server.create_bucket()


@pytest.fixture
def s3_store(moto_server, bucket) -> S3Store:
    return S3Store(bucket, "team/prefix", moto_server.options())


@pytest.fixture
def file_store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


@pytest.fixture(params=["file", "s3"])
def store(request):
    """The same tests on both stores: a local directory and a bucket over HTTP."""
    return request.getfixturevalue(f"{request.param}_store")


def _corrupt(store, key: str, *, keep_metadata: bool = True) -> None:
    """Flip one byte of the stored object ``key``, behind the store's back."""
    if isinstance(store, FileStore):
        path = store.root.joinpath(*key.split("/"))
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        return
    client = store._client
    full = f"{store.prefix}/{key}" if store.prefix else key
    response = client.get_object(Bucket=store.bucket, Key=full)
    data = bytearray(response["Body"].read())
    data[len(data) // 2] ^= 0x01
    metadata = response["Metadata"] if keep_metadata else {}
    client.put_object(Bucket=store.bucket, Key=full, Body=bytes(data), Metadata=metadata)


@pytest.fixture
def corrupt():
    """``corrupt(store, key, keep_metadata=True)``: flip a byte of a stored object."""
    return _corrupt
