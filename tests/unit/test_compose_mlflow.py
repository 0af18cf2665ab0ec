"""docker/compose.yaml's MLflow tracking server (the ``mlflow`` service), without an engine.

Why: a wrong flag, a Host header the server refuses or a password in a URL shows only
when the compose stack runs (tests/deploy/images/test_compose.py, minutes later), and a
default that cannot be turned off only when a team tries. Checked here: the Airflow
services track into ``http://mlflow:5000`` unless docker/.env names another server or
sets the variable empty (off); the service runs the lock's ``mlflow server`` (its options
parsed by MLflow's own CLI) from the Airflow image, its store the database ``mlflow`` of
the stack's PostgreSQL named without a password (PGPASSWORD), its artifacts proxied to
SeaweedFS with the store identity's key, path-style; it accepts the Host header the
Airflow services send; it is published on 127.0.0.1 only; and no Airflow service waits
for it.
"""

from __future__ import annotations

import shlex
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from support.dockerfiles import DOCKER, env_example, environment, interpolate

URI = "TRAINING_MLFLOW_TRACKING_URI"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]


@pytest.fixture(scope="module")
def mlflow(services) -> dict[str, Any]:
    return services["mlflow"]


def script(service: dict[str, Any]) -> list[str]:
    """The service's shell script (``sh -euc``), its continued lines joined."""
    assert service["entrypoint"] == ["/bin/sh", "-euc"]
    return service["command"][0].replace("\\\n", " ").splitlines()


def server_args(service: dict[str, Any], env: dict[str, str]) -> list[str]:
    """``mlflow server``'s arguments as the container's shell passes them."""
    line = next(line for line in script(service) if line.startswith("exec mlflow server"))
    container = {k: interpolate(v, env) for k, v in environment(service).items()}
    words = shlex.split(interpolate(line, env))[3:]
    return [container.get(w[1:], w) if w.startswith("$") else w for w in words]


def test_airflow_tracks_into_the_stacks_server_unless_env_names_another_or_empties_it(
        services):
    from training.deployment import tracking_uri_from_env

    airflow = [name for name in services if name.startswith("airflow-")]
    for name in airflow:
        value = environment(services[name])[URI]
        assert interpolate(value, {}) == "http://mlflow:5000", name
        assert interpolate(value, {URI: ""}) == "", name  # `-`, not `:-`: empty is off
        assert interpolate(value, {URI: "https://mlflow.team"}) == "https://mlflow.team"
        # A team's server behind basic auth: its login reaches MLflow's client.
        for login in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            assert interpolate(environment(services[name])[login], {}) == "", (name, login)
        # No Airflow service waits for it: tracking never stops a stack or a run.
        assert "mlflow" not in (services[name].get("depends_on") or {}), name
    assert tracking_uri_from_env({URI: "http://mlflow:5000"}) == "http://mlflow:5000"
    assert tracking_uri_from_env({URI: ""}) == ""
    assert "MLFLOW_PORT" in env_example()


def test_the_server_runs_the_locks_mlflow_from_the_airflow_image(mlflow, services):
    from click.testing import CliRunner
    from mlflow.cli import server

    assert (mlflow["image"], mlflow["build"]) == (services["airflow-worker"]["image"],
                                                  services["airflow-worker"]["build"])
    args = server_args(mlflow, env_example())
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--host"] == "0.0.0.0" and options["--port"] == "5000"
    assert options["--workers"] == "1"
    assert options["--artifacts-destination"] == "s3://models/mlflow"
    assert server_args(mlflow, {**env_example(), "TRAINING_BUCKET": "team"})[
        args.index("--artifacts-destination") + 1] == "s3://team/mlflow"
    # The lock's MLflow takes every option (--help parses them all first).
    result = CliRunner().invoke(server, [*args, "--help"])
    assert result.exit_code == 0, result.output
    env = environment(mlflow)
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert env["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert mlflow["init"] is True and mlflow["restart"] == "unless-stopped"


def test_its_store_is_the_mlflow_database_named_without_a_password(mlflow, services):
    from sqlalchemy.engine import make_url

    env = environment(mlflow)
    options = server_args(mlflow, env_example())
    store = options[options.index("--backend-store-uri") + 1]
    url = make_url(store)
    assert (url.drivername, url.host, url.port, url.database) == (
        "postgresql+psycopg2", "postgres", 5432, "mlflow")
    assert url.password is None and url.query["user"] == env_example()["POSTGRES_USER"]
    assert env["PGPASSWORD"] == "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD in docker/.env}"
    # The database is made first when missing, as airflow-init makes the sweeps'.
    create = next(line for line in script(mlflow) if line.startswith("python -c "))
    code = shlex.split(create)[2]
    compile(code, "mlflow-database", "exec")
    assert 'make_url(os.environ["MLFLOW_BACKEND_STORE_URI"])' in code
    assert "SELECT 1 FROM pg_database WHERE datname = %s" in code
    assert "CREATE DATABASE" in code and "password" not in code
    for name, condition in (("postgres", "service_healthy"), ("seaweedfs", "service_healthy")):
        assert mlflow["depends_on"][name]["condition"] == condition


def test_artifacts_go_to_seaweedfs_with_the_store_identitys_key_path_style(mlflow, services):
    env = environment(mlflow)
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://seaweedfs:8333"
    conn = environment(services["airflow-worker"])["AIRFLOW_CONN_AWS_DEFAULT"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name] in conn, name  # the same reference: Airflow's key, not the admin's
        assert "S3_ADMIN" not in env[name]
    write = next(line for line in script(mlflow) if line.startswith("printf "))
    assert write.endswith('> "$$AWS_CONFIG_FILE"') and env["AWS_CONFIG_FILE"].startswith("/")
    text = shlex.split(write)[1].replace("\\n", "\n")
    assert text == "[default]\ns3 =\n    addressing_style = path\n"


def test_it_accepts_the_airflow_services_host_and_is_published_on_127_0_0_1(mlflow, services):
    from mlflow.server.security_utils import is_allowed_host_header

    options = server_args(mlflow, env_example())
    allowed = options[options.index("--allowed-hosts") + 1].split(",")
    uri = interpolate(environment(services["airflow-worker"])[URI], {})
    for host in (urlsplit(uri).netloc, "127.0.0.1:5000", "localhost:15000"):
        assert is_allowed_host_header(allowed, host), host
    assert not is_allowed_host_header(allowed, "attacker.example:5000")
    assert mlflow["ports"] == ["127.0.0.1:${MLFLOW_PORT:-5000}:5000"]
    check = mlflow["healthcheck"]
    assert check["test"][:3] == ["CMD", "python", "-c"]
    assert "urlopen('http://localhost:5000/health'" in check["test"][3]
    compile(check["test"][3], "healthcheck", "exec")
