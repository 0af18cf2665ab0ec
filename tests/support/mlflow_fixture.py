"""The ``mlflow_server`` fixture: a real ``mlflow server`` process (``tools/mlflow_server.py``)
on 127.0.0.1 for one test module, its store a SQLite file in a temporary directory; and
``mlflow_s3_environment``, for a test that loads a model from S3 through MLflow in its own
process."""

from __future__ import annotations

import contextlib

import pytest

from tools.mlflow_server import MlflowServer
from tools.services import free_port_block


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), free_port_block(1))
    server.start()
    yield server
    server.stop()


@contextlib.contextmanager
def mlflow_s3_environment(env: dict[str, str]):
    """``env`` set for MLflow's in-process S3 reads (``mlflow.pyfunc.load_model`` of a
    ``models:/`` URI whose source is ``s3://``), with boto3's default session and MLflow's
    S3 client cache dropped on the way in and out.

    MLflow keeps its S3 clients for 5 minutes keyed by its arguments, not by the
    ``AWS_*`` environment, and boto3's default session keeps the first credentials it
    read. A pytest worker that loaded the production stack's champion and then, within
    those minutes, another test's champion read the second from the first S3 server
    (CI's run of stop 50 failed so)."""
    import boto3
    from mlflow.store.artifact import s3_artifact_repo

    def forget() -> None:
        s3_artifact_repo._cached_get_s3_client.cache_clear()
        boto3.DEFAULT_SESSION = None

    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        forget()
        try:
            yield
        finally:
            forget()
