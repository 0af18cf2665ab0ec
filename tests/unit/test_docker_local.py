"""docker/compose.local.yaml and docker/local/: what the deploy tests run here, checked
without a Docker engine.

Why: tests/deploy/images/test_compose.py brings compose.yaml up with the local override on
top (tests/support/compose.py); a wrong image name, a service the override names that
compose.yaml lacks, or a local image that runs as root would show only there, minutes
later. The override swaps in the images built from docker/local/Dockerfile, runs every
Airflow service and MLflow's server on the Airflow image, gives the network an explicit
subnet and keeps the GPU worker behind a profile; the compose tool's own lock pins every
file by hash. (Split from tests/unit/test_docker.py, which checks compose.yaml itself.)
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest
import yaml
from support.dockerfiles import DOCKER, ROOT, arg_default, copy_sources, interpolate, stages

LOCAL_COMPOSE = DOCKER / "compose.local.yaml"
LOCAL_DOCKERFILE = DOCKER / "local" / "Dockerfile"
AIRFLOW_SERVICES = {"airflow-init", "airflow-apiserver", "airflow-scheduler",
                    "airflow-dag-processor", "airflow-triggerer", "airflow-worker",
                    "airflow-worker-gpu"}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]


def test_the_local_override_swaps_in_local_images_and_leaves_the_gpu_worker_out(services):
    """docker/compose.local.yaml (what tests/deploy/images/test_compose.py runs): documented at
    its top, images that tests/support/compose.py builds from docker/local/Dockerfile, an
    explicit subnet, the GPU worker behind a profile."""
    from support.compose import LOCAL_IMAGES

    text = LOCAL_COMPOSE.read_text()
    assert text.startswith("# docker/compose.yaml on a machine that cannot pull")
    local = yaml.safe_load(text)
    assert set(local["services"]) <= set(services)
    targets = {alias for _, alias, _ in stages(LOCAL_DOCKERFILE)}
    assert set(LOCAL_IMAGES) == targets == {"postgres", "redis", "seaweedfs"}
    third_party = {"postgres": "postgres", "redis": "redis", "seaweedfs": "seaweedfs",
                   "seaweedfs-config": "seaweedfs"}
    for name, target in third_party.items():
        assert local["services"][name]["image"] == LOCAL_IMAGES[target], name
    for name in AIRFLOW_SERVICES | {"mlflow"}:  # MLflow's server runs the Airflow image
        assert interpolate(local["services"][name]["image"], {}) == services[
            "airflow-worker"]["image"], name
    assert local["services"]["airflow-worker-gpu"]["profiles"] == ["gpu"]
    subnet = local["networks"]["default"]["ipam"]["config"][0]["subnet"]
    assert interpolate(subnet, {}) == "10.214.0.0/24"
    assert local["services"]["seaweedfs"]["ports"] == ["127.0.0.1:${S3_PORT:-8333}:8333"]


def test_the_local_images_run_as_users_with_their_entrypoints():
    for _, alias, body in stages(LOCAL_DOCKERFILE):
        users = [rest for keyword, rest in body if keyword == "USER"]
        assert users and users[-1] not in ("root", "0"), alias
    for source in copy_sources(LOCAL_DOCKERFILE):
        assert source == "weed" or (LOCAL_DOCKERFILE.parent / source).is_file(), source
    script = LOCAL_DOCKERFILE.parent / "postgres-entrypoint.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["sh", "-n", os.fspath(script)], check=True)
    assert arg_default(LOCAL_DOCKERFILE, "BASE_IMAGE") is None  # the tests' base, always


def test_the_compose_tool_lock_pins_every_file_by_hash():
    lock = (ROOT / "tools" / "compose-requirements.txt").read_text()
    assert lock.startswith("# docker-compose 1.29.2")
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", lock, re.M))
    assert pins["docker-compose"] == "1.29.2"
    assert (pins["pyyaml"], pins["requests"], pins["urllib3"], pins["docker"]) == (
        "6.0.2", "2.31.0", "1.26.20", "6.1.3")
    blocks = re.split(r"^(?=[A-Za-z0-9_.-]+==)", lock, flags=re.M)[1:]
    assert len(blocks) == len(pins) and all("--hash=sha256:" in b for b in blocks)
