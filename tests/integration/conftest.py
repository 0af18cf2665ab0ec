"""Stores for the integration tests: a bucket on the session's S3 server, a local dir.

The S3 server (SeaweedFS in a child process) is ``tests/support/s3server.py``; the
session fixture ``s3_server`` lives in ``tests/conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.s3server import S3Server

from training.registry.local import FileStore
from training.registry.s3 import S3Store


@pytest.fixture
def fresh_s3_server(tmp_path_factory: pytest.TempPathFactory):
    """A second server, private to one test, that the test may kill and restart."""
    server = S3Server(tmp_path_factory.mktemp("fresh-s3-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server) -> str:
    """A fresh, empty bucket on the session's server."""
    return s3_server.create_bucket()


@pytest.fixture
def s3_store(s3_server, bucket) -> S3Store:
    return S3Store(bucket, "team/prefix", s3_server.options())


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
