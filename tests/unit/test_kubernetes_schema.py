"""Every object the Kubernetes launcher renders passes the Kubernetes OpenAPI schemas in
strict mode (no unknown field, no wrong type), for the oldest and the newest Kubernetes
version the project supports (docs/kubernetes.md), with ``kubernetes-validate`` and the
schemas it ships: no cluster, no network."""

from __future__ import annotations

import copy
import functools
import json
import re
import socket
from pathlib import Path

import importlib_resources
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from training.config import RunConfig
from training.launch import kubernetes as k8s

# The supported range, as docs/kubernetes.md states it (checked below).
KUBERNETES_VERSIONS = ("1.29.0", "1.33.0")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
SHARED_DIRS = {"output_dir": "/data/training/runs", "staging_dir": "/data/training/datasets"}
STAGED = {"name": "digits", "version": "1.0.0", "path": "/data/training/datasets/digits/1.0.0",
          "staging_dir": "/data/training/datasets", "fingerprint": "0" * 64}

# name: (RunConfig fields, KubernetesOptions fields, text only that variant renders)
VARIANTS = {
    "cpu": ({}, {}, '"requests": {"cpu": "2", "memory": "8Gi"}'),
    "gpu": ({"accelerator": "gpu", "num_gpus": 2}, {}, '"nvidia.com/gpu": "2"'),
    "tpu": ({"accelerator": "tpu"}, {}, '"google.com/tpu": "4"'),
    "tpu-slice": ({"accelerator": "tpu", "workers": 2, "strategy": "tpu"},
                  {"tpu_accelerator": "tpu-v4-podslice", "tpu_topology": "2x2x2"},
                  '"cloud.google.com/gke-tpu-topology": "2x2x2"'),
    "multi-worker": ({"workers": 2}, {}, '"completions": 2, "parallelism": 2'),
    "secrets": ({}, {"credentials_secret": "training-s3",
                     "env": {"AWS_ENDPOINT_URL": "https://s3.example.com"}}, "secretKeyRef"),
    "service-account": ({}, {"service_account": "trainer-wi"}, '"serviceAccountName"'),
    "shared-volume": (SHARED_DIRS, {"shared_volume_claim": "training-data"}, "staged.json"),
    "kueue": ({"accelerator": "gpu", "workers": 2}, {"kueue_queue": "team-a"},
              '"suspend": true'),
    "everything": ({"accelerator": "gpu", "workers": 4, "num_gpus": 8, **SHARED_DIRS},
                   {"credentials_secret": "training-s3", "service_account": "trainer-wi",
                    "shared_volume_claim": "training-data", "shared_mount_path": "/data",
                    "kueue_queue": "team-a.gpu", "node_selector": {"pool": "train"},
                    "tolerations": ({"key": "spot", "operator": "Exists"},),
                    "active_deadline_seconds": None, "ttl_seconds_after_finished": 3600,
                    "image": "registry.example.com/train:1", "image_pull_policy": "Always"},
                   '"ttlSecondsAfterFinished": 3600'),
}


class NoNetwork(AssertionError):
    pass


def _refuse(*args, **kwargs):
    raise NoNetwork(f"the schema check tried to reach the network: {args!r}")


@pytest.fixture(scope="module")
def validate():
    """``kubernetes_validate.validate`` in strict mode, with its schema files read once
    per module (they are 1 MB of JSON per version) and every socket refused."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kv_utils, "schema_contents", functools.cache(kv_utils.schema_contents))
        patch.setattr(socket.socket, "connect", _refuse)
        patch.setattr(socket, "create_connection", _refuse)
        patch.setattr(socket, "getaddrinfo", _refuse)

        def check(obj: dict, version: str) -> str:
            try:
                return kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                raise AssertionError(f"{obj['kind']} {obj['metadata']['name']} fails the "
                                     f"Kubernetes {version} schema at {where}: "
                                     f"{exc.message}") from None

        yield check


def rendered(variant: str) -> list[dict]:
    flat, options, _ = VARIANTS[variant]
    cfg = RunConfig.from_flat({"launcher": "kubernetes", **flat})
    return k8s.render(cfg, k8s.KubernetesOptions(namespace="ml", **options), STAGED)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_passes_the_strict_schema(validate, variant, version):
    objects = rendered(variant)
    assert VARIANTS[variant][2] in json.dumps(objects)  # the variant renders what it names
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "Job"]
    for obj in objects:
        # the schema of exactly this version, not an older one it fell back to
        assert validate(obj, version) == version.rsplit(".", 1)[0]
    # what kubectl gets from `render` (YAML) is the same objects, valid too
    for obj in yaml.safe_load_all(k8s.to_yaml(objects)):
        validate(obj, version)


@pytest.mark.parametrize("variant", ["kueue", "everything"])
def test_the_launcher_creates_exactly_the_objects_checked(variant):
    flat, options, _ = VARIANTS[variant]
    cfg = RunConfig.from_flat({"launcher": "kubernetes", **flat})
    job = k8s.TrainingJob(cfg, k8s.KubernetesOptions(namespace="ml", **options), log=None,
                          staged=STAGED)
    assert [job.config_map, job.service, job.job] == rendered(variant)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("variant", "index", "path", "field"), [
    ("cpu", 2, ("spec", "template", "spec"), "restartPolcy"),  # restartPolicy misspelt
    ("kueue", 2, ("spec",), "suspended"),
    ("secrets", 1, ("spec",), "clusterIp"),
    ("shared-volume", 0, (), "datа"),  # a Cyrillic a
])
def test_a_misspelt_field_fails_the_check(validate, variant, index, path, field, version):
    obj = copy.deepcopy(rendered(variant)[index])
    validate(obj, version)  # the object as rendered passes
    node = obj
    for key in path:
        node = node[key]
    node[field] = True
    with pytest.raises(AssertionError, match=rf"fails the Kubernetes {version} schema at "
                                             rf"{re.escape('.'.join(path))}: .*'{field}' "
                                             r"was unexpected"):
        validate(obj, version)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_wrong_type_fails_the_check(validate, version):
    job = copy.deepcopy(rendered("multi-worker")[2])
    job["spec"]["completions"] = "2"
    with pytest.raises(AssertionError, match=r"at spec.completions: '2' is not of type"):
        validate(job, version)


def test_the_check_is_offline_and_uses_the_schemas_shipped_with_it(validate):
    with pytest.raises(NoNetwork):  # the guard the checks run under does refuse sockets
        socket.create_connection(("127.0.0.1", 9))
    schemas = importlib_resources.files("kubernetes_validate") / "kubernetes-json-schema"
    for version in KUBERNETES_VERSIONS:
        folder = schemas / f"v{version}-local-strict"
        for kind in ("configmap-v1", "service-v1", "job-batch-v1", "_definitions"):
            assert (folder / f"{kind}.json").is_file(), (version, kind)


def test_the_docs_state_the_versions_checked():
    text = " ".join(DOCS.read_text().split())
    oldest, newest = (v.rsplit(".", 1)[0] for v in KUBERNETES_VERSIONS)
    assert f"Kubernetes {oldest} to {newest}" in text
