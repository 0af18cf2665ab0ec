"""docker/: what can be checked without a Docker engine.

The compose file parses and wires the stack as documented; every image is pinned or
built from a Dockerfile in the repository; every COPY source exists and survives the
Dockerfile's .dockerignore; each image's entrypoint runs (this machine's .venv python
standing in for the image's interpreter); the Airflow services' commands parse with
Airflow's own CLI; the GPU worker listens on the queue the routing policy uses; no
secret is written into the compose file.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
AIRFLOW_SERVICES = {"airflow-init", "airflow-apiserver", "airflow-scheduler",
                    "airflow-dag-processor", "airflow-triggerer", "airflow-worker",
                    "airflow-worker-gpu"}
EXPECTED_SERVICES = AIRFLOW_SERVICES | {"postgres", "redis", "seaweedfs", "seaweedfs-config"}
DEPLOYMENT_SETTINGS = {"TRAINING_DATA_DIR", "TRAINING_STAGING_DIR", "TRAINING_OUTPUT_DIR",
                       "TRAINING_STORE_URI", "TRAINING_AWS_CONN_ID", "TRAINING_SCHEDULE",
                       "TRAINING_GPU_QUEUE"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|_KEY$|TOKEN|_AUTH$|ACCESS_KEY|FERNET", re.I)
_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


# ------------------------------------------------------------------ compose helpers


class MissingVariable(Exception):
    pass


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err},
    ${VAR?err}; ``$$`` is a literal ``$``."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        present, val = name in env, env.get(name, "")
        if op == ":-":
            return val if val else arg
        if op == "-":
            return val if present else arg
        if op in (":?", "?") and (not present or (op == ":?" and not val)):
            raise MissingVariable(f"{name}: {arg}")
        return val

    parts = value.split("$$")
    return "$".join(_REF.sub(one, part) for part in parts)


def walk_strings(node: Any, path: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk_strings(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk_strings(value, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def env_example() -> dict[str, str]:
    values = {}
    for line in (DOCKER / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, Any]:
    return compose["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


# --------------------------------------------------------------- Dockerfile helpers


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.strip().partition(" ")
        result.append((keyword.upper(), rest.strip()))
        current = ""
    return result


def exec_form(args: str) -> list[str]:
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def from_images(dockerfile: Path) -> list[tuple[str, str | None]]:
    """(image reference with ARG defaults substituted, stage name) for every FROM."""
    args: dict[str, str] = {}
    stages: list[tuple[str, str | None]] = []
    for keyword, rest in instructions(dockerfile):
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--platform")]
            image = interpolate(words[0], args)
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append((image, alias))
    return stages


def pinned(image: str) -> bool:
    """A digest, or a tag that is neither empty nor ``latest``."""
    if "@sha256:" in image:
        return True
    name = image.rsplit("/", 1)[-1]
    if ":" not in name:
        return False
    tag = name.split(":", 1)[1]
    return bool(tag) and tag != "latest" and "$" not in tag


def copy_sources(dockerfile: Path) -> list[str]:
    sources = []
    for keyword, rest in instructions(dockerfile):
        if keyword not in ("COPY", "ADD"):
            continue
        words = exec_form(rest) if rest.startswith("[") else rest.split()
        flags = [w for w in words if w.startswith("--")]
        if any(f.startswith("--from=") for f in flags) or any("<<" in w for w in words):
            continue  # from another stage or a heredoc: nothing from the context
        paths = [w for w in words if not w.startswith("--")]
        assert len(paths) >= 2, f"{dockerfile.name}: {keyword} {rest!r} needs src and dest"
        sources.extend(paths[:-1])
    return sources


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore ``patterns`` exclude ``path`` (last matching rule wins)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip("/")
        if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", ""))
               for p in prefixes):
            verdict = not negate
    return verdict


def dockerignore(dockerfile: Path) -> list[str]:
    path = dockerfile.with_name(dockerfile.name + ".dockerignore")
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


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


def test_every_image_is_pinned_or_built_from_a_dockerfile_here(services):
    for name, service in services.items():
        image = service.get("image", "")
        if "build" in service:
            build = service["build"]
            context = (DOCKER / build["context"]).resolve()
            assert context == ROOT, f"{name}: build context must be the repository root"
            assert (context / build["dockerfile"]).is_file(), name
            stages = [alias for _, alias in from_images(context / build["dockerfile"])]
            assert build.get("target") in stages, (name, build.get("target"), stages)
        assert image and pinned(image), f"{name}: image {image!r} is not pinned"
    for dockerfile in DOCKERFILES:
        seen_stages: set[str] = set()
        for image, alias in from_images(dockerfile):
            assert image in seen_stages or pinned(image), f"{dockerfile.name}: FROM {image}"
            if alias:
                seen_stages.add(alias)


def test_base_images_are_the_documented_ones():
    bases = {d.name: from_images(d)[0][0] for d in DOCKERFILES}
    assert bases == {
        "airflow.Dockerfile": "apache/airflow:3.3.2-python3.11",
        "training-gpu.Dockerfile": "tensorflow/tensorflow:2.21.0-gpu",
        "training-tpu.Dockerfile": "python:3.11.14-slim-bookworm",
    }


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_and_are_not_dockerignored(dockerfile):
    sources = copy_sources(dockerfile)
    assert {"pyproject.toml", "uv.lock", "training/", "plugins/"} <= set(sources)
    patterns = dockerignore(dockerfile)
    for source in sources:
        assert glob.glob(os.fspath(ROOT / source)), f"{dockerfile.name}: {source} missing"
        assert not ignored(source, patterns), f"{dockerfile.name}: {source} is dockerignored"
    assert ignored(".venv/bin/python", patterns) and ignored("var/runs", patterns)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_install_from_the_lock_and_drop_root(dockerfile):
    text = dockerfile.read_text()
    assert "uv export --frozen --no-dev" in text
    assert '"uv==${UV_VERSION}"' in text and "ARG UV_VERSION=0.13.8" in text
    assert "pip check" in text
    users = [rest for keyword, rest in instructions(dockerfile) if keyword == "USER"]
    assert users and users[-1] not in ("root", "0"), f"{dockerfile.name} runs as root"


def test_training_entrypoints_run():
    """ENTRYPOINT + CMD of each training image, with this machine's python standing in."""
    ran = []
    for dockerfile in DOCKERFILES:
        parts = dict(instructions(dockerfile))
        if "ENTRYPOINT" not in parts:
            continue
        entry = exec_form(parts["ENTRYPOINT"])
        cmd = exec_form(parts.get("CMD", "[]")) or ["--help"]
        assert entry[0] in ("python", "python3"), entry
        result = subprocess.run([sys.executable, *entry[1:], *cmd], capture_output=True,
                                text=True, timeout=120, cwd=ROOT)
        assert result.returncode == 0, (dockerfile.name, result.stderr[-2000:])
        assert "usage:" in result.stdout
        ran.append(dockerfile.name)
    assert sorted(ran) == ["training-gpu.Dockerfile", "training-tpu.Dockerfile"]


def test_no_secret_is_written_into_the_compose_file(compose):
    for path, value in walk_strings(compose):
        key = path.rsplit(".", 1)[-1]
        if SECRET_NAME.search(key) or key.endswith("ROOT_USER"):
            stripped = _REF.sub("", value)
            assert not stripped.strip(), f"{path} holds a literal value: {value!r}"
        for _user, password in re.findall(r"://([^:@/\s]*):([^@\s]*)@", value):
            assert _REF.fullmatch(password), f"{path}: a password in a URL: {value!r}"
    conn = compose["x-airflow-env"]["AIRFLOW_CONN_AWS_DEFAULT"]
    for field in ("login", "password"):
        assert re.search(rf'"{field}": "\$\{{[A-Z_]+:\?[^}}]*\}}"', conn), field


def test_env_example_names_every_required_variable_with_placeholders(compose):
    required = {m["name"] for _, value in walk_strings(compose)
                for m in _REF.finditer(value) if m["op"] in (":?", "?")}
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
    assert worker["build"]["target"] == "airflow-gpu"
    for env in ({}, {"TRAINING_GPU_QUEUE": "a100"}):
        command = shlex.split(interpolate(worker["command"], env))
        queue = command[command.index("--queues") + 1]
        routed = interpolate(environment(worker)["TRAINING_GPU_QUEUE"], env)
        assert queue == routed == env.get("TRAINING_GPU_QUEUE", "gpu")
    default = shlex.split(services["airflow-worker"]["command"])
    assert default[default.index("--queues") + 1] == "default"
    assert "deploy" not in services["airflow-worker"]


def test_airflow_commands_connection_and_settings_with_airflow_itself(services, tmp_path):
    """One Airflow process: the commands parse, the queue and connection resolve."""
    example = env_example()
    worker_env = {k: interpolate(v, example)
                  for k, v in environment(services["airflow-worker-gpu"]).items()}
    commands = [shlex.split(services[name]["command"]) for name in sorted(AIRFLOW_SERVICES)
                if not services[name]["command"].startswith("celery")]
    probe = f"""
import json, os
from airflow.cli.cli_parser import get_parser
from airflow.configuration import conf
from airflow.models.connection import Connection
from training_airflow.params import aws_conn_id, deployment_settings
from training_airflow.policies import queue_for
env = json.loads(os.environ["PROBE_ENV"])
parser = get_parser()
parsed = [parser.parse_args(c).func.__name__ for c in {commands!r}]
conn = Connection.from_json(env["AIRFLOW_CONN_AWS_DEFAULT"], conn_id=aws_conn_id(env))
print(json.dumps({{
    "parsed": parsed,
    "default_queue": conf.get("operators", "default_queue"),
    "conn": [conn.conn_id, conn.conn_type, conn.login, conn.extra_dejson],
    "settings": deployment_settings(env),
    "gpu_queue": queue_for("gpu"),
}}))
"""
    run_env = {**os.environ, "PROBE_ENV": json.dumps(worker_env),
               "AIRFLOW_HOME": os.fspath(tmp_path)}
    run_env.pop("TRAINING_GPU_QUEUE", None)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=180, env=run_env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["parsed"] == ["api_server", "dag_processor", "version", "scheduler",
                             "triggerer"]
    assert out["default_queue"] == "default"
    assert out["gpu_queue"] == "gpu"
    conn_id, conn_type, login, extra = out["conn"]
    assert (conn_id, conn_type, login) == ("aws_default", "aws", example["STORE_ACCESS_KEY"])
    assert extra["endpoint_url"] == "http://seaweedfs:8333"
    assert out["settings"] == {"staging_dir": "/opt/airflow/training/datasets",
                               "output_dir": "/opt/airflow/training/runs",
                               "store_uri": "s3://models/registry"}


def test_dev_stack_passes_airflow_the_settings_compose_passes(compose, tmp_path):
    """``./dev stack`` is the compose stack as processes: every setting it gives Airflow
    (but the paths of one machine's checkout) is one the compose file sets too, and the
    secrets' names are the ``.env`` file's."""
    from tools.stack import SECRETS, ProductionStack

    stack = ProductionStack(tmp_path, {}, 18080, None)
    local_paths = {"AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER"}
    assert set(stack.defaults()) - local_paths <= set(compose["x-airflow-env"])
    assert set(SECRETS) <= set(env_example())
    connection = json.loads(stack.defaults()["AIRFLOW_CONN_AWS_DEFAULT"])
    assert connection["login"] == stack.secrets["STORE_ACCESS_KEY"]
    assert stack.secrets["S3_ADMIN_SECRET_KEY"] not in json.dumps(stack.env)
