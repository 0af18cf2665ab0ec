"""The ``mlflow_server`` fixture: a real ``mlflow server`` process (``tools/mlflow_server.py``)
on 127.0.0.1 for one test module, its store a SQLite file in a temporary directory."""

from __future__ import annotations

import pytest

from tools.mlflow_server import MlflowServer
from tools.services import free_port_block


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), free_port_block(1))
    server.start()
    yield server
    server.stop()
