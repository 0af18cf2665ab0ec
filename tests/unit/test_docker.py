"""docker/: what can be checked without a Docker engine.

Why: a mistake in the compose file or the Dockerfile otherwise shows only when a stack
or a build runs (tests/deploy/), minutes later. The compose file parses and wires the
stack as documented; every image is pinned, or built from docker/Dockerfile's targets
with the tags ``./dev images`` gives them; every COPY and bind-mount source exists and
survives the .dockerignore; the training entrypoint runs (this machine's .venv python
standing in for the image's interpreter); the Airflow services' commands parse with
Airflow's own CLI and the admin's password reaches SimpleAuthManager; no healthcheck
needs a tool the images lack; the GPU worker listens on the queue the routing policy
uses; no secret is written into the compose file. The local override
(docker/compose.local.yaml, docker/local/) and the compose tool's lock:
tests/unit/test_docker_local.py; MLflow's server: tests/unit/test_compose_mlflow.py.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from typing import Any

import pytest
import yaml
from support.dockerfiles import (
    DOCKER,
    REFERENCE,
    ROOT,
    MissingVariable,
    arg_default,
    copy_sources,
    dockerignore,
    env_example,
    environment,
    exec_form,
    ignored,
    interpolate,
    pinned,
    stage,
    stages,
    walk_strings,
)

COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
AIRFLOW_SERVICES = {"airflow-init", "airflow-apiserver", "airflow-scheduler",
                    "airflow-dag-processor", "airflow-triggerer", "airflow-worker",
                    "airflow-worker-gpu"}
EXPECTED_SERVICES = AIRFLOW_SERVICES | {"postgres", "redis", "seaweedfs", "seaweedfs-config",
                                         "mlflow"}
DEPLOYMENT_SETTINGS = {"TRAINING_DATA_DIR", "TRAINING_STAGING_DIR", "TRAINING_OUTPUT_DIR",
                       "TRAINING_STORE_URI", "TRAINING_AWS_CONN_ID", "TRAINING_SCHEDULE",
                       "TRAINING_GPU_QUEUE"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|_KEY$|TOKEN|_AUTH$|ACCESS_KEY|FERNET", re.I)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, Any]:
    return compose["services"]


# ----------------------------------------------------------------------- the tests


def test_compose_has_the_stack(services):
    assert set(services) == EXPECTED_SERVICES
    commands = {name: services[name]["command"] for name in AIRFLOW_SERVICES}
    assert commands["airflow-apiserver"] == "api-server"
    assert commands["airflow-scheduler"] == "scheduler"
    assert commands["airflow-dag-processor"] == "dag-processor"
    assert commands["airflow-triggerer"] == "triggerer"
    assert commands["airflow-worker"].startswith("celery worker")
    assert commands["airflow-worker-gpu"].startswith("celery worker")
    # No entrypoint script in the image does it: airflow-init migrates, itself.
    assert "airflow db migrate\n" in commands["airflow-init"][0]
    for name in AIRFLOW_SERVICES:
        env = environment(services[name])
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert "@postgres:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name
        assert "@redis:6379/" in env["AIRFLOW__CELERY__BROKER_URL"], name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == (
            "http://airflow-apiserver:8080/execution/"), name
        assert set(env) >= DEPLOYMENT_SETTINGS, (name, DEPLOYMENT_SETTINGS - set(env))
    assert services["seaweedfs"]["depends_on"]["seaweedfs-config"]["condition"] == (
        "service_completed_successfully")
    assert '"Write:$$BUCKET"' in services["seaweedfs-config"]["command"][0]
    # The UI on 127.0.0.1 unless docker/.env says otherwise, MLflow's on 127.0.0.1 only
    # (tests/unit/test_compose_mlflow.py); nothing else published.
    assert services["airflow-apiserver"]["ports"] == [
        "${AIRFLOW_BIND_ADDRESS:-127.0.0.1}:${AIRFLOW_PORT:-8080}:8080"]
    assert {n for n, s in services.items() if "ports" in s} == {"airflow-apiserver", "mlflow"}


def test_compose_keeps_to_what_compose_v1_accepts(compose):
    """docker-compose 1.29 (what tests/deploy/images/test_compose.py runs) refuses these."""
    assert set(compose) - {"services", "volumes", "networks"} == {"x-airflow-env", "x-airflow"}
    # (A `!reset` tag would already have failed yaml.safe_load.) Docker 25's start_interval:
    for name, service in compose["services"].items():
        assert set(service.get("healthcheck", {})) <= {
            "test", "interval", "timeout", "retries", "start_period"}, name
    assert env_example()["COMPOSE_PROJECT_NAME"] == "keras-training"  # instead of name:


def test_the_shared_data_volume_is_mounted_at_the_same_path_in_every_airflow_service(
        compose, services):
    assert "training-data" in compose["volumes"]
    for name in AIRFLOW_SERVICES:
        data_dir = environment(services[name])["TRAINING_DATA_DIR"]
        assert f"training-data:{data_dir}" in services[name]["volumes"], name
        env = environment(services[name])
        for key in ("TRAINING_STAGING_DIR", "TRAINING_OUTPUT_DIR"):
            assert env[key].startswith(data_dir + "/"), (name, key)


def test_the_store_is_seaweedfs_over_s3_through_the_aws_default_connection(services):
    example = env_example()
    env = {k: interpolate(v, example) for k, v in environment(services["airflow-worker"]).items()}
    assert env["TRAINING_STORE_URI"] == f"s3://{example['TRAINING_BUCKET']}/registry"
    assert env["TRAINING_STORE_URI"].startswith("s3://models/")
    assert env["TRAINING_AWS_CONN_ID"] == "aws_default"
    conn = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    assert conn["conn_type"] == "aws"
    assert conn["extra"]["endpoint_url"] == "http://seaweedfs:8333"
    assert (conn["login"], conn["password"]) == (example["STORE_ACCESS_KEY"],
                                                 example["STORE_SECRET_KEY"])
    assert "S3_ADMIN_SECRET_KEY" not in json.dumps(environment(services["airflow-worker"]))
    init = environment(services["seaweedfs-config"])
    assert init["STORE_ACCESS_KEY"].startswith("${STORE_ACCESS_KEY")
    assert interpolate(init["BUCKET"], example) == example["TRAINING_BUCKET"]


def test_images_are_pinned_or_built_from_the_dockerfile_as_dev_images_tags_them(services):
    from training import __version__

    targets = [alias for _, alias, _ in stages(DOCKERFILE)]
    for name, service in services.items():
        assert pinned(service["image"]), f"{name}: image {service['image']!r} is not pinned"
        if "build" not in service:
            continue
        build = service["build"]
        assert (DOCKER / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE, name
        assert build["target"] == "airflow" and "airflow" in targets, name
        accelerator = build["args"]["ACCELERATOR"]
        assert f"{accelerator})" in DOCKERFILE.read_text(), name  # a branch of its case
        # tools/images.py's tag for that target and accelerator
        assert service["image"] == f"airflow-keras-training-airflow:{__version__}-{accelerator}"
    for image, alias, _ in stages(DOCKERFILE):
        assert image in targets or pinned(image), f"FROM {image} AS {alias}"


def test_the_dockerfile_targets_and_build_arguments():
    assert [alias for _, alias, _ in stages(DOCKERFILE)] == [
        "locked", "accelerated", "training", "airflow"]
    assert stages(DOCKERFILE)[0][0] == "python:3.11.14-slim-bookworm"  # BASE_IMAGE
    assert arg_default(DOCKERFILE, "ACCELERATOR") == "gpu"
    assert arg_default(DOCKERFILE, "OFFLINE") == "false"
    text = DOCKERFILE.read_text()
    for branch in ("cpu)", "gpu)", "tpu)",
                   "*) echo \"ACCELERATOR must be cpu, gpu, gpu-jax or tpu"):
        assert branch in text, branch
    # backend: jax on NVIDIA GPUs: the CUDA 13 plugin of the lock's own jax
    assert 'gpu-jax) uv pip install --constraint /tmp/constraints.txt "jax[cuda13]==' in text
    locked = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    assert arg_default(DOCKERFILE, "JAX_VERSION") == next(
        p["version"] for p in locked if p["name"] == "jax")
    # OFFLINE: no index at all, only the wheelhouse (every stage that installs).
    assert text.count('if [ "$OFFLINE" = true ]; then export') == 3


def test_copy_sources_exist_and_are_not_dockerignored():
    sources = copy_sources(DOCKERFILE)
    assert {"pyproject.toml", "uv.lock", "training/", "plugins/", "dags/",
            "docker/wheelhouse"} <= set(sources)
    patterns = dockerignore(DOCKERFILE)
    for source in sources:
        assert glob.glob(os.fspath(ROOT / source)), f"{source} missing"
        assert not ignored(source, patterns), f"{source} is dockerignored"
    assert ignored(".venv/bin/python", patterns) and ignored("var/runs", patterns)


@pytest.mark.parametrize("target", ["training", "airflow"])
def test_images_install_from_the_lock_and_drop_root(target):
    text = DOCKERFILE.read_text()
    assert "uv export --frozen --no-dev" in text
    assert '"uv==${UV_VERSION}"' in text and "ARG UV_VERSION=0.13.8" in text
    body = stage(DOCKERFILE, target)
    assert any("pip check" in rest for keyword, rest in body if keyword == "RUN"), target
    users = [rest for keyword, rest in body if keyword == "USER"]
    assert users and users[-1] == "50000", f"{target} runs as {users[-1:] or 'root'}"


def test_entrypoints():
    """The training target's ENTRYPOINT + CMD run, this machine's python standing in."""
    training = dict(stage(DOCKERFILE, "training"))
    entry, cmd = exec_form(training["ENTRYPOINT"]), exec_form(training["CMD"])
    assert entry == ["python", "-m", "training"] and cmd == ["--help"]
    result = subprocess.run([sys.executable, *entry[1:], *cmd], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
    assert exec_form(dict(stage(DOCKERFILE, "airflow"))["ENTRYPOINT"]) == ["airflow"]


def test_healthchecks_use_only_what_the_images_have(services):
    """No curl in the images: HTTP checks are python's urllib, which must compile."""
    have = {"python", "airflow", "celery", "pg_isready", "redis-cli", "wget"}
    for name, service in services.items():
        test = service["healthcheck"]["test"] if "healthcheck" in service else None
        if test is None:
            assert name in ("seaweedfs-config", "airflow-init"), f"{name}: no healthcheck"
            continue
        words = test[1:] if test[0] == "CMD" else shlex.split(test[1].replace("$$", "$"))
        assert words[0] in have, (name, words[0])
        if words[:2] == ["python", "-c"]:
            compile(words[2], name, "exec")


def test_no_secret_is_written_into_the_compose_file(compose):
    for path, value in walk_strings(compose):
        key = path.rsplit(".", 1)[-1]
        if (SECRET_NAME.search(key) or key.endswith("ROOT_USER")) and not key.endswith("_FILE"):
            stripped = REFERENCE.sub("", value)
            assert not stripped.strip(), f"{path} holds a literal value: {value!r}"
        for _user, password in re.findall(r"://([^:@/\s]*):([^@\s]*)@", value):
            assert REFERENCE.fullmatch(password), f"{path}: a password in a URL: {value!r}"
    conn = compose["x-airflow-env"]["AIRFLOW_CONN_AWS_DEFAULT"]
    for field in ("login", "password"):
        assert re.search(rf'"{field}": "\$\{{[A-Z_]+:\?[^}}]*\}}"', conn), field


def test_env_example_names_every_required_variable_with_placeholders(compose):
    required = {m["name"] for _, value in walk_strings(compose)
                for m in REFERENCE.finditer(value) if m["op"] in (":?", "?")}
    example = env_example()
    assert required <= set(example), required - set(example)
    for name, value in example.items():
        if SECRET_NAME.search(name) or name.endswith("ACCESS_KEY"):
            assert value == "change-me", f"{name} must be a placeholder in .env.example"
    with pytest.raises(MissingVariable, match="POSTGRES_PASSWORD"):
        interpolate(compose["x-airflow-env"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], {})
    assert ".env" in (DOCKER / ".gitignore").read_text().split()


def test_gpu_worker_listens_on_the_routing_policy_queue_and_has_the_gpus(services):
    worker = services["airflow-worker-gpu"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert worker["build"]["args"]["ACCELERATOR"] == "gpu"
    for env in ({}, {"TRAINING_GPU_QUEUE": "a100"}):
        command = shlex.split(interpolate(worker["command"], env))
        queue = command[command.index("--queues") + 1]
        routed = interpolate(environment(worker)["TRAINING_GPU_QUEUE"], env)
        assert queue == routed == env.get("TRAINING_GPU_QUEUE", "gpu")
    default = shlex.split(services["airflow-worker"]["command"])
    assert default[default.index("--queues") + 1] == "default"
    assert "deploy" not in services["airflow-worker"]
    assert services["airflow-worker"]["build"]["args"]["ACCELERATOR"] == "cpu"


def test_airflow_commands_connection_settings_and_login_with_airflow_itself(services,
                                                                             tmp_path):
    """One Airflow process: the commands parse, the queue and connection resolve, and the
    passwords file airflow-init writes gives SimpleAuthManager's admin docker/.env's
    password."""
    example = env_example()
    worker_env = {k: interpolate(v, example)
                  for k, v in environment(services["airflow-worker-gpu"]).items()}
    script = services["airflow-init"]["command"][0].splitlines()
    commands = [shlex.split(services[name]["command"]) for name in sorted(AIRFLOW_SERVICES)
                if name != "airflow-init" and not services[name]["command"].startswith("celery")]
    commands += [shlex.split(line)[1:] for line in script if line.startswith("airflow ")]
    passwords_file = worker_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    for name in ("airflow-init", "airflow-apiserver"):
        assert f"airflow-auth:{os.path.dirname(passwords_file)}" in services[name]["volumes"]
    write = next(line for line in script if line.endswith(f"> {passwords_file}"))
    init_env = {k: interpolate(v, example)
                for k, v in environment(services["airflow-init"]).items()}
    written = tmp_path / "passwords.json"
    subprocess.run(["sh", "-euc", write.replace("python", sys.executable, 1)
                    .replace(passwords_file, os.fspath(written))], env=init_env, check=True)
    probe = f"""
import json, os
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.cli.cli_parser import get_parser
from airflow.configuration import conf
from airflow.models.connection import Connection
from training.deployment import Deployment
env = json.loads(os.environ["PROBE_ENV"])
deployment = Deployment.from_env(env)
parser = get_parser()
parsed = [parser.parse_args(c).func.__name__ for c in {commands!r}]
conn = Connection.from_json(env["AIRFLOW_CONN_AWS_DEFAULT"], conn_id=deployment.aws_conn_id)
print(json.dumps({{
    "parsed": parsed,
    "default_queue": conf.get("operators", "default_queue"),
    "conn": [conn.conn_id, conn.conn_type, conn.login, conn.extra_dejson],
    "settings": deployment.run_settings(),
    "gpu_queue": deployment.queue_for("gpu"),
    "users": [[u.username, u.role] for u in SimpleAuthManager.get_users()],
    "passwords": SimpleAuthManager.get_passwords(),
}}))
"""
    run_env = {**os.environ, "PROBE_ENV": json.dumps(worker_env),
               "AIRFLOW_HOME": os.fspath(tmp_path),
               **{k: v for k, v in worker_env.items() if "AUTH_MANAGER" in k},
               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": os.fspath(written)}
    run_env.pop("TRAINING_GPU_QUEUE", None)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=180, env=run_env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["parsed"] == ["api_server", "dag_processor", "scheduler", "triggerer",
                             "migratedb"]
    assert out["default_queue"] == "default"
    assert out["gpu_queue"] == "gpu"
    conn_id, conn_type, login, extra = out["conn"]
    assert (conn_id, conn_type, login) == ("aws_default", "aws", example["STORE_ACCESS_KEY"])
    assert extra["endpoint_url"] == "http://seaweedfs:8333"
    assert out["settings"] == {
        "staging_dir": "/opt/airflow/training/datasets",
        "output_dir": "/opt/airflow/training/runs", "store_uri": "s3://models/registry",
        # sweeps' studies in the stack's PostgreSQL, no password in the URL
        "sweep_storage": "postgresql+psycopg2://postgres:5432/optuna?user=airflow"}
    assert out["users"] == [[example["AIRFLOW_ADMIN_USER"], "admin"]]
    assert out["passwords"] == {example["AIRFLOW_ADMIN_USER"]: example["AIRFLOW_ADMIN_PASSWORD"]}


def test_dev_stack_passes_airflow_the_settings_compose_passes(compose, tmp_path, monkeypatch):
    """``./dev stack`` is the compose stack as processes: every setting it gives Airflow
    (but the paths of one machine's checkout) is one the compose file sets too, and the
    secrets' names are the ``.env`` file's. (Its servers' binaries need not be here.)"""
    import tools.seaweedfs
    import tools.services
    from tools.stack import SECRETS, ProductionStack

    for module in (tools.services, tools.seaweedfs):
        monkeypatch.setattr(module, "find_binary", lambda name, *globs, package: name)
    stack = ProductionStack(tmp_path, {}, 18080, None)
    local_paths = {"AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER"}
    assert set(stack.defaults()) - local_paths <= set(compose["x-airflow-env"])
    assert set(SECRETS) <= set(env_example())
    connection = json.loads(stack.defaults()["AIRFLOW_CONN_AWS_DEFAULT"])
    assert connection["login"] == stack.secrets["STORE_ACCESS_KEY"]
    assert stack.secrets["S3_ADMIN_SECRET_KEY"] not in json.dumps(stack.env)
