"""``render(cfg, options)``: a run's ConfigMap, headless Service and Indexed Job.

Plain dicts, in apply order:

1. a **ConfigMap** holding ``cfg.to_json()`` as ``config.json`` (mounted read-only at
   ``/etc/training``), so every pod trains on exactly the validated config;
2. a headless **Service** (``clusterIP: None``) selecting the run's pods, so worker ``i``
   is reachable at ``<job>-<i>.<service>.<namespace>.svc:<port>``;
3. an **Indexed Job** of ``runtime.workers`` pods (``completions = parallelism = N``,
   ``subdomain`` = the Service), each running the pod wrapper (``pod.WRAPPER``) around
   ``python -m training train --config /etc/training/config.json`` (and ``--staged
   /etc/training/staged.json`` when the DAG handed over its staged dataset); with
   ``options.shared_volume_claim`` its pods also mount that claim over the output and
   staging directories, at the same path as on the Airflow workers; with
   ``options.kueue_queue`` the Job carries Kueue's queue label and is created suspended
   (``kueue``), so Kueue admits all its pods together.

What a pod asks for on GPU and TPU nodes comes from ``scheduling``. Credentials are never
rendered: pods read them from a named Secret (``secretKeyRef``) or get them from the
platform identity of their service account. Names derive from the run id only, so a
retry renders the same objects. Nothing here imports TensorFlow or the ``kubernetes``
client; the unit tests check every shape against the client's models.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from training import __version__, backend
from training.config import RunConfig
from training.errors import ConfigError
from training.launch.kubernetes.kueue import QUEUE_LABEL
from training.launch.kubernetes.names import job_name, run_id_label
from training.launch.kubernetes.options import (
    CREDENTIAL_KEYS,
    OPTIONAL_CREDENTIAL_KEYS,
    KubernetesOptions,
)
from training.launch.kubernetes.pod import (
    ENV_JOB,
    ENV_NAMESPACE,
    ENV_PORT,
    ENV_SERVICE,
    ENV_WORKERS,
    WRAPPER,
)
from training.launch.kubernetes.scheduling import check_accelerator, scheduling

APP_NAME = "airflow-keras-training"
IMAGE_REPOSITORY = "ghcr.io/example/airflow-keras-training"
GPU_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}-gpu"
TPU_IMAGE = f"{IMAGE_REPOSITORY}:{__version__}-tpu"
LABEL_PREFIX = "training.example.com"
FINGERPRINT_KEY = f"{LABEL_PREFIX}/config-fingerprint"
CONFIG_DIR = "/etc/training"
CONFIG_FILE = "config.json"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
CONTAINER_NAME = "trainer"
PORT_NAME = "grpc"
SHARED_VOLUME = "shared"
STAGED_FILE = "staged.json"
TRAIN_COMMAND = ("python", "-m", "training", "train", "--config", CONFIG_PATH)


def default_image(accelerator: str) -> str:
    """The project's training image for an accelerator (the GPU image also runs on CPU)."""
    return TPU_IMAGE if accelerator == "tpu" else GPU_IMAGE


def shared_mount_path(cfg: RunConfig, options: KubernetesOptions) -> str:
    """Where the shared volume goes: the option, else the output and staging dirs' parent.

    The volume is mounted at the same path as on the Airflow workers, so a path means the
    same file in a pod and in the evaluate/publish tasks.
    """
    dirs = [cfg.storage.output_dir, cfg.dataset.staging_dir]
    for path in dirs:
        if not posixpath.isabs(path):
            raise ConfigError(
                f"storage.output_dir and dataset.staging_dir must be absolute paths for a "
                f"shared volume (set TRAINING_OUTPUT_DIR/TRAINING_STAGING_DIR or "
                f"TRAINING_DATA_DIR), got {path!r}"
            )
    dirs = [posixpath.normpath(d) for d in dirs]
    mount = options.shared_mount_path
    if mount is None:
        mount = posixpath.commonpath(dirs)
        if mount == "/":
            raise ConfigError(
                f"storage.output_dir {dirs[0]!r} and dataset.staging_dir {dirs[1]!r} share no "
                "parent directory but '/'; set KubernetesOptions.shared_mount_path "
                "(TRAINING_K8S_SHARED_MOUNT) to where the volume is mounted"
            )
    mount = posixpath.normpath(mount)
    for path in dirs:
        if posixpath.commonpath([mount, path]) != mount:
            raise ConfigError(f"KubernetesOptions.shared_mount_path must contain "
                              f"storage.output_dir and dataset.staging_dir, got {mount!r} "
                              f"for {path!r}")
    if posixpath.commonpath([mount, CONFIG_DIR]) in (mount, CONFIG_DIR):
        raise ConfigError(f"KubernetesOptions.shared_mount_path must not contain or lie in "
                          f"{CONFIG_DIR}, got {mount!r}")
    return mount


def _check_config(cfg: RunConfig, options: KubernetesOptions) -> None:
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"render needs a RunConfig, got {type(cfg).__name__}")
    # runtime.workers > 1 needs a multi-worker strategy: RunConfig checks it when built.
    check_accelerator(cfg, options)


def _metadata(cfg: RunConfig, job: str, namespace: str) -> dict[str, Any]:
    return {
        "name": job,
        "namespace": namespace,
        "labels": _labels(cfg, job),
        "annotations": {
            f"{LABEL_PREFIX}/run-id": cfg.run_id,
            FINGERPRINT_KEY: cfg.fingerprint(),
        },
    }


def _labels(cfg: RunConfig, job: str) -> dict[str, str]:
    return {
        **_selector(job),
        "app.kubernetes.io/component": "training",
        "app.kubernetes.io/version": __version__,
        f"{LABEL_PREFIX}/run-id": run_id_label(cfg.run_id),
        f"{LABEL_PREFIX}/accelerator": cfg.runtime.accelerator,
    }


def _selector(job: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": job}


def _env(cfg: RunConfig, options: KubernetesOptions, job: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": ENV_JOB, "value": job},
        {"name": ENV_SERVICE, "value": job},
        {"name": ENV_NAMESPACE, "value": options.namespace},
        {"name": ENV_WORKERS, "value": str(cfg.runtime.workers)},
        {"name": ENV_PORT, "value": str(options.port)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # Set before the pod's process imports Keras (training.backend)
        *({"name": k, "value": v} for k, v in backend.env(cfg.runtime.backend).items()),
    ]
    env += [{"name": k, "value": v} for k, v in options.env.items()]
    if options.credentials_secret:
        for key in CREDENTIAL_KEYS + OPTIONAL_CREDENTIAL_KEYS:
            ref = {"name": options.credentials_secret, "key": key}
            if key in OPTIONAL_CREDENTIAL_KEYS:
                ref["optional"] = True
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    return env


def _pod_spec(cfg: RunConfig, options: KubernetesOptions, job: str,
              staged: bool) -> dict[str, Any]:
    sched = scheduling(cfg, options)
    command = [*WRAPPER, *TRAIN_COMMAND]
    if staged:
        command += ["--staged", f"{CONFIG_DIR}/{STAGED_FILE}"]
    container = {
        "name": CONTAINER_NAME,
        "image": options.image or default_image(cfg.runtime.accelerator),
        "imagePullPolicy": options.image_pull_policy,
        "command": command,
        "env": _env(cfg, options, job),
        "ports": [{"name": PORT_NAME, "containerPort": options.port, "protocol": "TCP"}],
        "resources": sched["resources"],
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": job}}]
    if options.shared_volume_claim:
        volumes.append({"name": SHARED_VOLUME, "persistentVolumeClaim": {
            "claimName": options.shared_volume_claim}})
        container["volumeMounts"].append(
            {"name": SHARED_VOLUME, "mountPath": shared_mount_path(cfg, options)})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": job,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes,
    }
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    if sched["node_selector"]:
        pod_spec["nodeSelector"] = sched["node_selector"]
    if sched["tolerations"]:
        pod_spec["tolerations"] = sched["tolerations"]
    return pod_spec


def render(cfg: RunConfig, options: KubernetesOptions | None = None,
           staged: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """ConfigMap, Service and Indexed Job for ``cfg``, in apply order, as plain dicts.

    ``staged``: the staged dataset the DAG's ``stage_dataset`` handed over (its XCom).
    With a shared volume (``options.shared_volume_claim``, mounted over the staging
    directory) it goes into the ConfigMap as ``staged.json`` and the pods train on it
    (``--staged``: verified, not staged again). Without one the pods cannot see it, and
    each stages the dataset itself, as ``python -m training train`` does.
    """
    options = KubernetesOptions() if options is None else options
    if not isinstance(options, KubernetesOptions):
        raise ConfigError(f"options must be KubernetesOptions, got {type(options).__name__}")
    _check_config(cfg, options)
    staged = staged if options.shared_volume_claim else None
    job = job_name(cfg.run_id)
    namespace = options.namespace
    workers = cfg.runtime.workers

    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(cfg, job, namespace),
        "data": {CONFIG_FILE: cfg.to_json(),
                 **({STAGED_FILE: json.dumps(dict(staged), sort_keys=True)} if staged else {})},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(cfg, job, namespace),
        "spec": {
            "clusterIP": "None",
            "selector": _selector(job),
            # Workers dial each other while starting, before any readiness.
            "publishNotReadyAddresses": True,
            "ports": [{"name": PORT_NAME, "port": options.port, "targetPort": options.port,
                       "protocol": "TCP"}],
        },
    }
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": workers,
        "parallelism": workers,
        "backoffLimit": options.backoff_limit,
        "template": {"metadata": {"labels": _labels(cfg, job)},
                     "spec": _pod_spec(cfg, options, job, staged=bool(staged))},
    }
    if options.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = options.active_deadline_seconds
    if options.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = options.ttl_seconds_after_finished
    rules: list[dict[str, Any]] = []
    if options.fail_job_exit_codes:
        rules.append({"action": "FailJob", "onExitCodes": {
            "containerName": CONTAINER_NAME, "operator": "In",
            "values": sorted(set(options.fail_job_exit_codes))}})
    # A preempted or evicted pod does not count against backoffLimit.
    rules.append({"action": "Ignore",
                  "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]})
    job_spec["podFailurePolicy"] = {"rules": rules}
    job_meta = _metadata(cfg, job, namespace)
    if options.kueue_queue:
        # Kueue unsuspends it once the whole Job fits its queue's quota.
        job_meta["labels"][QUEUE_LABEL] = options.kueue_queue
        job_spec["suspend"] = True
    job_obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta,
               "spec": job_spec}
    return [config_map, service, job_obj]


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """A multi-document YAML stream for ``kubectl apply -f -``.

    Multi-line strings (the config) are written in block style so they stay readable.
    PyYAML is imported here: the pods' ``exec`` wrapper does not need it.
    """
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, represent_str)
    return yaml.dump_all([dict(o) for o in objects], Dumper=Dumper, sort_keys=False,
                         default_flow_style=False, explicit_start=True)
