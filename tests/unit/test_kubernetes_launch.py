"""Kubernetes specs: valid against the official client models, consistent TF_CONFIGs,
accelerator scheduling, the shared volume rendered in, no credentials, deterministic
names, clear option errors (one style, from a dict or the TRAINING_K8S_* variables)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from training.config import RunConfig
from training.errors import ConfigError
from training.launch import kubernetes as k8s
from training.launch.kubernetes.manifests import CONFIG_FILE, LABEL_PREFIX, TPU_IMAGE
from training.launch.kubernetes.names import MAX_JOB_NAME
from training.launch.kubernetes.pod import WRAPPER
from training.launch.kubernetes.scheduling import GPU_TOLERATION, TPU_TOLERATION
from training.train import cluster

KINDS = {"ConfigMap": "V1ConfigMap", "Service": "V1Service", "Job": "V1Job"}
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
TPU_TOPOLOGY = {1: "2x2", 4: "4x4"}  # 4 chips per worker: 1 host, 4 hosts


def make(accelerator: str = "cpu", workers: int = 1, **overrides):
    cfg = RunConfig.from_flat({"accelerator": accelerator, "workers": workers, **overrides})
    options = k8s.KubernetesOptions(namespace="ml", tpu_topology=TPU_TOPOLOGY.get(workers, "2x2"))
    return cfg, options, k8s.render(cfg, options)


def container(job: dict) -> dict:
    (only,) = job["spec"]["template"]["spec"]["containers"]
    return only


def env_of(job: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container(job)["env"]}


@pytest.fixture(scope="module")
def api_client():
    kubernetes = pytest.importorskip("kubernetes")
    return kubernetes.client.ApiClient()


def as_model(api_client, obj: dict, kind: str):
    """``obj`` read as the client reads an API response (public ``deserialize``)."""
    return api_client.deserialize(SimpleNamespace(data=json.dumps(obj)), kind)


# --- the objects are valid Kubernetes -------------------------------------------------
@pytest.mark.parametrize("accelerator", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("workers", [1, 4])
def test_objects_round_trip_through_the_client_models(api_client, accelerator, workers):
    _, _, objects = make(accelerator, workers)
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "Job"]
    for obj in objects:
        model = as_model(api_client, obj, KINDS[obj["kind"]])
        assert type(model).__name__ == KINDS[obj["kind"]]
        # Nothing unknown or misspelt was dropped, no type was coerced.
        assert api_client.sanitize_for_serialization(model) == obj
        assert model.metadata.name and model.metadata.namespace == "ml"


@pytest.mark.parametrize("accelerator", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("workers", [1, 4])
def test_job_service_and_config_map_fit_together(accelerator, workers):
    cfg, _, (config_map, service, job) = make(accelerator, workers)
    name = job["metadata"]["name"]
    assert config_map["metadata"]["name"] == service["metadata"]["name"] == name
    # the pods train on exactly the validated config
    shipped = config_map["data"][CONFIG_FILE]
    assert shipped == cfg.to_json()
    assert RunConfig.from_json(shipped) == cfg
    assert RunConfig.from_json(shipped).run_id == cfg.run_id

    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == workers
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == service["metadata"]["name"]
    c = container(job)
    assert c["command"] == [*WRAPPER, "python", "-m", "training", "train",
                            "--config", "/etc/training/config.json"]
    assert c["volumeMounts"] == [{"name": "config", "mountPath": "/etc/training",
                                  "readOnly": True}]
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": name}}]
    assert c["ports"][0]["containerPort"] == 2222

    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["port"] == 2222
    pod_labels = spec["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert pod_labels[f"{LABEL_PREFIX}/run-id"] == cfg.run_id
    assert job["metadata"]["annotations"][f"{LABEL_PREFIX}/run-id"] == cfg.run_id
    codes = spec["podFailurePolicy"]["rules"][0]["onExitCodes"]
    assert codes["containerName"] == c["name"] and codes["values"] == [2]


def test_the_staged_dataset_handed_over_goes_to_every_pod(api_client):
    cfg = RunConfig.from_flat({"accelerator": "gpu", "workers": 2,
                               "output_dir": "/data/runs", "staging_dir": "/data/datasets"})
    staged = {"name": "digits", "version": "1.0.0", "path": "/data/datasets/digits/1.0.0",
              "staging_dir": "/data/datasets", "fingerprint": "ab" * 32,
              "key": f"digits:1.0.0@{'ab' * 32}"}
    shared = k8s.KubernetesOptions(namespace="ml", shared_volume_claim="training-data")
    config_map, _, job = k8s.render(cfg, shared, staged)
    assert json.loads(config_map["data"]["staged.json"]) == staged
    assert container(job)["command"][-4:] == [
        "--config", "/etc/training/config.json", "--staged", "/etc/training/staged.json"]
    for obj, kind in ((config_map, "V1ConfigMap"), (job, "V1Job")):
        assert api_client.sanitize_for_serialization(as_model(api_client, obj, kind)) == obj
    # without a shared volume the pods cannot see it: each stages the dataset itself
    plain_map, _, plain_job = k8s.render(cfg, k8s.KubernetesOptions(namespace="ml"), staged)
    assert "staged.json" not in plain_map["data"]
    assert "--staged" not in container(plain_job)["command"]


def test_to_yaml_is_the_same_objects():
    _, _, objects = make("gpu", 4)
    text = k8s.to_yaml(objects)
    assert list(yaml.safe_load_all(text)) == objects
    assert "config.json: |" in text  # the config stays readable for kubectl users


# --- TF_CONFIG --------------------------------------------------------------------------
def pod_env(job: dict, index: int) -> dict[str, str]:
    """The environment one pod of the rendered Job gets (plain values + its index)."""
    env = {name: e["value"] for name, e in env_of(job).items() if "value" in e}
    return {**env, "JOB_COMPLETION_INDEX": str(index)}


@pytest.mark.parametrize("workers", [2, 4, 64])
def test_workers_get_distinct_consistent_tf_configs(workers):
    _, _, (_, service, job) = make("gpu", workers)
    name, svc = job["metadata"]["name"], service["metadata"]["name"]
    configs = [k8s.tf_config_from_env(pod_env(job, i)) for i in range(workers)]
    assert len(set(configs)) == workers
    parsed = [json.loads(c) for c in configs]
    expected_hosts = [f"{name}-{i}.{svc}.ml.svc:2222" for i in range(workers)]
    for i, (raw, data) in enumerate(zip(configs, parsed, strict=True)):
        assert data["cluster"] == {"worker": expected_hosts}
        assert data["task"] == {"type": "worker", "index": i}
        assert cluster.workers(raw) == workers
        assert cluster.is_chief(raw) is (i == 0)
        assert raw == k8s.tf_config_for_index(name, svc, "ml", workers, i, 2222)
    # each host is a valid pod hostname under the Service's subdomain
    for host in expected_hosts:
        assert len(host.split(".")[0]) <= 63 and DNS_1035.match(host.split(".")[0])


def test_one_worker_gets_no_tf_config_and_the_function_still_works():
    _, _, (_, _, job) = make("cpu", 1)
    assert k8s.tf_config_from_env(pod_env(job, 0)) is None
    raw = k8s.tf_config_for_index("train-x", "train-x", "ml", 1, 0)
    assert cluster.workers(raw) == 1 and cluster.is_chief(raw)


def test_exec_wrapper_sets_tf_config_for_the_training_command(tmp_path):
    _, _, (_, _, job) = make("cpu", 3)
    env = {**os.environ, **pod_env(job, 2)}
    env.pop("TF_CONFIG", None)
    probe = "import os; print(os.environ['TF_CONFIG'])"
    out = subprocess.run(
        [sys.executable, "-m", "training.launch.kubernetes", "exec", "--",
         sys.executable, "-c", probe],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    assert json.loads(out)["task"] == {"type": "worker", "index": 2}


def test_tf_config_errors_name_the_value():
    with pytest.raises(ConfigError, match=r"worker index must be between 0 and 3 .* got 4"):
        k8s.tf_config_for_index("j", "j", "ml", 4, 4)
    with pytest.raises(ConfigError, match="JOB_COMPLETION_INDEX must be .* got None"):
        env = pod_env(make("cpu", 2)[2][2], 0)
        env.pop("JOB_COMPLETION_INDEX")
        k8s.tf_config_from_env(env)
    with pytest.raises(ConfigError, match="TRAINING_JOB_NAME.* are not set"):
        k8s.tf_config_from_env({})


def test_module_imports_neither_tensorflow_nor_the_kubernetes_client():
    code = ("import sys, training.launch.kubernetes; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'kubernetes', 'yaml', 'airflow') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


# --- accelerators ---------------------------------------------------------------------
def test_gpu_pods_ask_for_gpus_on_gpu_nodes():
    _, _, (_, _, job) = make("gpu", 2, num_gpus=4)
    pod = job["spec"]["template"]["spec"]
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert GPU_TOLERATION in pod["tolerations"]
    assert "google.com/tpu" not in json.dumps(job)
    # one GPU by default; the selector label is configurable
    cfg = RunConfig.from_flat({"accelerator": "gpu"})
    opts = k8s.KubernetesOptions(gpu_node_selector={"nvidia.com/gpu.product": "H100"})
    job = k8s.render(cfg, opts)[2]
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}


def test_tpu_pods_ask_for_tpu_chips_on_gke_tpu_nodes():
    cfg = RunConfig.from_flat({"accelerator": "tpu", "workers": 2, "strategy": "tpu"})
    opts = k8s.KubernetesOptions(tpu_accelerator="tpu-v4-podslice", tpu_topology="2x2x2")
    job = k8s.render(cfg, opts)[2]
    pod = job["spec"]["template"]["spec"]
    resources = container(job)["resources"]
    assert resources["requests"]["google.com/tpu"] == resources["limits"]["google.com/tpu"] == "4"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v4-podslice",
                                   "cloud.google.com/gke-tpu-topology": "2x2x2"}
    assert TPU_TOLERATION in pod["tolerations"]
    assert "nvidia.com/gpu" not in json.dumps(job)
    assert container(job)["image"] == TPU_IMAGE


def test_cpu_pods_ask_for_no_accelerator():
    _, _, (_, _, job) = make("cpu", 4)
    pod = job["spec"]["template"]["spec"]
    text = json.dumps(job)
    assert "nvidia.com/gpu" not in text and "google.com/tpu" not in text
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert container(job)["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"},
                                           "limits": {"memory": "8Gi"}}


def test_extra_node_selector_and_tolerations_are_added():
    cfg = RunConfig.from_flat({"accelerator": "gpu"})
    spot = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"}
    opts = k8s.KubernetesOptions(node_selector={"pool": "train"}, tolerations=(spot,))
    pod = k8s.render(cfg, opts)[2]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["pool"] == "train"
    assert pod["tolerations"] == [GPU_TOLERATION, spot]


def test_a_kueue_queue_labels_the_job_and_creates_it_suspended(api_client):
    cfg = RunConfig.from_flat({"accelerator": "gpu", "workers": 2})
    objects = k8s.render(cfg, k8s.KubernetesOptions(namespace="ml", kueue_queue="team-a"))
    job = objects[2]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True
    assert as_model(api_client, job, "V1Job").spec.suspend is True
    # only the Job is queued; without a queue nothing of it is rendered
    assert "kueue" not in json.dumps(objects[:2])
    plain = json.dumps(k8s.render(cfg, k8s.KubernetesOptions(namespace="ml")))
    assert "kueue" not in plain and "suspend" not in plain


# --- credentials ------------------------------------------------------------------------
FAKE_KEY_ID = "AKIAFAKEKEYID0000042"
FAKE_SECRET = "fake/Secret+Value+That+Must+Never+Appear0"
FAKE_TOKEN = "FakeSessionToken//neverRendered=="


def test_no_secret_value_is_ever_rendered(monkeypatch, api_client):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", FAKE_TOKEN)
    cfg = RunConfig.from_flat({"accelerator": "gpu", "workers": 2,
                               "store_uri": "s3://models-bucket/prod"})
    opts = k8s.KubernetesOptions(credentials_secret="training-s3",
                                 env={"AWS_ENDPOINT_URL": "https://s3.example.com",
                                      "AWS_DEFAULT_REGION": "eu-west-1"})
    objects = k8s.render(cfg, opts)
    rendered = k8s.to_yaml(objects) + json.dumps(objects)
    for value in (FAKE_KEY_ID, FAKE_SECRET, FAKE_TOKEN):
        assert value not in rendered
    env = env_of(objects[2])
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        assert "value" not in env[key]
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "training-s3" and ref["key"] == key
    assert env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert env["AWS_ENDPOINT_URL"]["value"] == "https://s3.example.com"
    model = as_model(api_client, objects[2], "V1Job")
    assert api_client.sanitize_for_serialization(model) == objects[2]


def test_platform_identity_uses_the_service_account_and_no_secret(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    cfg = RunConfig.from_flat({"accelerator": "tpu"})
    opts = k8s.KubernetesOptions(service_account="trainer-wi")
    objects = k8s.render(cfg, opts)
    pod = objects[2]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer-wi"
    text = k8s.to_yaml(objects)
    assert FAKE_SECRET not in text and "secretKeyRef" not in text and "AWS_" not in text


@pytest.mark.parametrize("key", ["AWS_SECRET_ACCESS_KEY", "MY_API_TOKEN", "DB_PASSWORD"])
def test_credentials_in_plain_env_are_refused(key):
    with pytest.raises(ConfigError, match=f"must not carry credentials, got the key '{key}'"):
        k8s.KubernetesOptions(env={key: FAKE_SECRET})


# --- names and determinism ------------------------------------------------------------
def test_rendering_is_deterministic():
    cfg = RunConfig.from_flat({"accelerator": "gpu", "workers": 4, "epochs": 3})
    opts = k8s.KubernetesOptions(namespace="ml")
    first, second = k8s.render(cfg, opts), k8s.render(RunConfig.from_json(cfg.to_json()), opts)
    assert first == second
    assert k8s.to_yaml(first) == k8s.to_yaml(second)
    assert first[2]["metadata"]["name"] == f"train-{cfg.run_id}"


@pytest.mark.parametrize("run_id", [
    "nightly-2024-01-01",
    "Nightly_Run.2024",
    "A" * 128,
    "x" + "-" * 100 + "y",
    "9lives",
    "run.with.dots-",
    "manual__2024-01-01T00.00.00_UTC__" + "z" * 80,
])
def test_names_are_valid_labels_for_any_run_id(run_id, api_client):
    cfg = RunConfig.from_flat({"run_id": run_id, "workers": 64, "accelerator": "cpu"})
    objects = k8s.render(cfg)
    name = objects[2]["metadata"]["name"]
    assert DNS_1035.match(name) and len(name) <= MAX_JOB_NAME
    assert len(f"{name}-63") <= 63  # the last pod's hostname
    label = objects[2]["metadata"]["labels"][f"{LABEL_PREFIX}/run-id"]
    assert LABEL_VALUE.match(label) and 0 < len(label) <= 63
    assert k8s.job_name(run_id) == name  # same run id, same names: a retry finds them
    assert objects[2]["metadata"]["annotations"][f"{LABEL_PREFIX}/run-id"] == run_id
    model = as_model(api_client, objects[2], "V1Job")
    assert api_client.sanitize_for_serialization(model) == objects[2]


def test_run_ids_that_sanitize_alike_get_different_names():
    ids = ["Run_1", "run-1", "RUN.1", "a" * 100, "a" * 99 + "b"]
    names = {k8s.job_name(i) for i in ids}
    labels = {k8s.run_id_label(i) for i in ids}
    assert len(names) == len(labels) == len(ids)
    assert k8s.job_name("run-1") == "train-run-1"


# --- errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(("field", "value", "match"), [
    ("namespace", "ML_Team", "must be a DNS-1123 label .* got 'ML_Team'"),
    ("image", "has space:1", "must be an image reference .* got 'has space:1'"),
    ("image_pull_policy", "Sometimes", "must be one of Always, IfNotPresent, Never"),
    ("service_account", "Bad_SA", "must be None or a Kubernetes object name"),
    ("credentials_secret", "", "must be None or a Kubernetes object"),
    ("port", 0, "must be an integer between 1 and 65535, got 0"),
    ("port", "2222", "must be an integer between 1 and 65535, got '2222'"),
    ("backoff_limit", -1, "must be an integer between 0 and 100, got -1"),
    ("active_deadline_seconds", 0, "must be None or an integer of at least 1, got 0"),
    ("tpu_topology", "2by2", "must be a GKE TPU topology .* got '2by2'"),
    ("tpu_accelerator", "v5e", "must be a GKE TPU accelerator .* got 'v5e'"),
    ("tpu_chips_per_worker", 3, "must be one of 1, 4, 8, got 3"),
    ("memory", "lots", "must be a positive Kubernetes quantity .* got 'lots'"),
    ("cpu", "0", "must be a positive Kubernetes quantity .* got '0'"),
    ("gpu_node_selector", {"cloud.google.com/gke-accelerator": "nvidia l4"},
     "must be a mapping of label keys to label values"),
    ("env", {"1BAD": "x"}, "must be a mapping whose keys are environment variable names"),
    ("env", {"TF_CONFIG": "{}"}, "must be a mapping without keys the launcher sets"),
    ("tolerations", ({"key": "a", "operator": "Maybe"},),
     "must be tolerations with operator Exists or Equal"),
    ("tolerations", "nvidia.com/gpu", "must be a list of toleration objects"),
    ("fail_job_exit_codes", (0,), "must be a list of exit codes"),
    ("shared_volume_claim", "Data_Claim", "must be None or a PersistentVolumeClaim name"),
    ("shared_mount_path", "data", "must be None or an absolute directory other than '/', "
                                  "got 'data'"),
    ("shared_mount_path", "/", "must be None or an absolute directory"),
    ("poll_interval", -1, "must be between 0 and 3600 seconds, got -1"),
    ("poll_interval", True, "must be between 0 and 3600 seconds, got True"),
    ("failure_lines", 0, "must be an integer between 1 and 1000, got 0"),
    ("kueue_queue", "Team_A", "must be None or a Kueue LocalQueue name in the Job's namespace "
                              r"\(a-z, 0-9, '-' and '.', at most 63 characters: it is a label "
                              r"value\), got 'Team_A'"),
    ("kueue_queue", "q" * 64, "must be None or a Kueue LocalQueue name"),
    ("kueue_queue", 7, "must be None or a Kueue LocalQueue name .* got 7"),
])
def test_bad_options_say_field_value_and_what_is_allowed(field, value, match):
    with pytest.raises(ConfigError, match=rf"KubernetesOptions\.{field} {match}"):
        k8s.KubernetesOptions(**{field: value})


def test_options_from_dict_rejects_unknown_keys_and_round_trips():
    opts = k8s.KubernetesOptions(namespace="ml", tolerations=({"key": "a",
                                                                "operator": "Exists"},))
    assert k8s.KubernetesOptions.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
    with pytest.raises(ConfigError, match="unknown Kubernetes option 'namespce'; allowed: "
                                          "namespace, image"):
        k8s.KubernetesOptions.from_dict({"namespce": "ml"})


@pytest.mark.parametrize(("flat", "options", "match"), [
    ({"accelerator": "tpu", "workers": 2}, {"tpu_topology": "2x2"},
     r"runtime.workers must be the TPU slice's hosts: topology '2x2' has 4 chips, which is "
     r"1 workers of 4 chips \(tpu_chips_per_worker\), got 2"),
    ({"num_gpus": 2}, {}, "runtime.accelerator must be 'gpu' when runtime.num_gpus"),
    ({"strategy": "tpu", "accelerator": "gpu"}, {},
     "runtime.accelerator must be 'tpu' when runtime.strategy is 'tpu', got 'gpu'"),
    ({"all_reduce": "nccl", "workers": 2}, {},
     r"runtime.accelerator must be 'gpu' when runtime.all_reduce is 'nccl' \(NCCL needs a "
     r"GPU on every worker\), got 'cpu'; or set runtime.all_reduce to 'auto' or 'ring'"),
])
def test_config_and_options_must_agree(flat, options, match):
    cfg = RunConfig.from_flat(flat)
    with pytest.raises(ConfigError, match=match):
        k8s.render(cfg, k8s.KubernetesOptions(**options))


def test_workers_that_would_train_alone_never_reach_render():
    """The workers/strategy rule is the config's (checked when any config is built), so
    render never sees 4 pods that would each train alone."""
    with pytest.raises(ConfigError, match=r"runtime.strategy must be .*got 'mirrored' with "
                                          r"runtime.workers=4: .*every worker would train alone"):
        RunConfig.from_flat({"launcher": "kubernetes", "workers": 4, "strategy": "mirrored"})


def test_render_command_prints_what_render_returns(tmp_path, capsys):
    cfg = RunConfig.from_flat({"accelerator": "gpu", "workers": 2})
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json())
    opts = tmp_path / "options.json"
    opts.write_text(json.dumps({"credentials_secret": "training-s3"}))
    argv = ["render", "--config", str(path), "--options", str(opts), "--namespace", "ml"]
    assert k8s.main(argv) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    expected = k8s.KubernetesOptions(namespace="ml", credentials_secret="training-s3")
    assert printed == k8s.render(cfg, expected)
    assert k8s.main(["render", "--namespace", "Bad NS"]) == 2
    assert "KubernetesOptions.namespace must be" in capsys.readouterr().err


# --- the shared volume is rendered in ---------------------------------------------------
def shared(output_dir: str, staging_dir: str, **options):
    cfg = RunConfig.from_flat({"launcher": "kubernetes", "workers": 2,
                               "output_dir": output_dir, "staging_dir": staging_dir})
    opts = k8s.KubernetesOptions(namespace="ml", shared_volume_claim="training-data",
                                 **options)
    return k8s.render(cfg, opts)


def test_shared_volume_claim_is_mounted_over_output_and_staging_dirs(api_client):
    objects = shared("/data/training/runs", "/data/training/datasets")
    job = objects[2]
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "config", "configMap": {"name": job["metadata"]["name"]}},
        {"name": "shared", "persistentVolumeClaim": {"claimName": "training-data"}},
    ]
    assert container(job)["volumeMounts"] == [
        {"name": "config", "mountPath": "/etc/training", "readOnly": True},
        {"name": "shared", "mountPath": "/data/training"},  # the dirs' common parent
    ]
    assert api_client.sanitize_for_serialization(as_model(api_client, job, "V1Job")) == job
    # an explicit mount path; and the same objects on every render (a retry finds them)
    explicit = shared("/data/training/runs", "/data/training/datasets",
                      shared_mount_path="/data")[2]
    assert {"name": "shared", "mountPath": "/data"} in container(explicit)["volumeMounts"]
    assert shared("/data/training/runs", "/data/training/datasets") == objects


def test_without_a_shared_volume_nothing_is_mounted_but_the_config():
    _, _, (_, _, job) = make("cpu", 2)
    assert [v["name"] for v in job["spec"]["template"]["spec"]["volumes"]] == ["config"]


@pytest.mark.parametrize(("dirs", "mount", "message"), [
    (("runs", "/data/datasets"), None, "must be absolute paths"),
    (("/runs", "/datasets"), None, "share no parent directory but '/'"),
    (("/data/runs", "/data/datasets"), "/data/runs",
     "KubernetesOptions.shared_mount_path must contain storage.output_dir"),
    (("/etc/training/runs", "/etc/training/ds"), None,
     "KubernetesOptions.shared_mount_path must not contain or lie in"),
])
def test_shared_mount_must_hold_both_directories(dirs, mount, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        shared(*dirs, shared_mount_path=mount)


def test_a_mount_path_without_a_claim_is_refused():
    with pytest.raises(ConfigError, match=re.escape(
            "KubernetesOptions.shared_mount_path must be None when shared_volume_claim "
            "(TRAINING_K8S_SHARED_PVC) is not set")):
        k8s.KubernetesOptions(shared_mount_path="/data")


# --- options from the TRAINING_K8S_* variables ------------------------------------------
@pytest.mark.parametrize(("env", "message"), [
    ({"TRAINING_K8S_OPTIONS": "{"}, "TRAINING_K8S_OPTIONS must be a JSON object"),
    ({"TRAINING_K8S_OPTIONS": "[]"}, "TRAINING_K8S_OPTIONS must be a JSON object of "
                                     "Kubernetes options, got list"),
    ({"TRAINING_K8S_OPTIONS": '{"nodes": 3}'},
     "TRAINING_K8S_OPTIONS: unknown Kubernetes option 'nodes'"),
    ({"TRAINING_K8S_OPTIONS": '{"cpu": "0"}'},
     "TRAINING_K8S_OPTIONS: KubernetesOptions.cpu must be a positive Kubernetes quantity"),
    ({"TRAINING_K8S_NAMESPACE": "ML"}, "TRAINING_K8S_NAMESPACE: KubernetesOptions.namespace "
                                       "must be"),
    ({"TRAINING_K8S_POLL_INTERVAL": "soon"}, "TRAINING_K8S_POLL_INTERVAL must be a number, "
                                             "got 'soon'"),
    ({"TRAINING_K8S_POLL_INTERVAL": "-1"}, "TRAINING_K8S_POLL_INTERVAL: KubernetesOptions."
                                           "poll_interval must be between 0 and 3600 seconds, "
                                           "got -1.0"),
    ({"TRAINING_K8S_FAILURE_LINES": "0"}, "TRAINING_K8S_FAILURE_LINES: KubernetesOptions."
                                          "failure_lines must be an integer between 1 and 1000"),
    ({"TRAINING_K8S_SHARED_PVC": "Data_Claim"},
     "TRAINING_K8S_SHARED_PVC: KubernetesOptions.shared_volume_claim must be None or a "
     "PersistentVolumeClaim name"),
    ({"TRAINING_K8S_SHARED_MOUNT": "/data"},
     "TRAINING_K8S_SHARED_MOUNT: KubernetesOptions.shared_mount_path must be None when "
     "shared_volume_claim (TRAINING_K8S_SHARED_PVC) is not set"),
    ({"TRAINING_K8S_KUEUE_QUEUE": "team a"},
     "TRAINING_K8S_KUEUE_QUEUE: KubernetesOptions.kueue_queue must be None or a Kueue "
     "LocalQueue name"),
    ({"TRAINING_K8S_SHARED_PVC": "d", "TRAINING_K8S_SHARED_MOUNT": "data"},
     "TRAINING_K8S_SHARED_MOUNT: KubernetesOptions.shared_mount_path must be None or an "
     "absolute directory"),
])
def test_env_errors_name_the_variable_and_value(env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        k8s.KubernetesOptions.from_env(env)


def test_env_json_with_single_overrides():
    options = k8s.KubernetesOptions.from_env({
        "TRAINING_K8S_OPTIONS": json.dumps({"namespace": "a", "image": "r/i:1", "cpu": "4",
                                            "poll_interval": 9}),
        "TRAINING_K8S_NAMESPACE": "b", "TRAINING_K8S_SERVICE_ACCOUNT": "trainer",
        "TRAINING_K8S_POLL_INTERVAL": "2.5", "TRAINING_K8S_IMAGE": "",
        "TRAINING_K8S_FAILURE_LINES": "7", "TRAINING_K8S_KUEUE_QUEUE": "team-a",
    })
    assert (options.namespace, options.image, options.cpu, options.service_account) == (
        "b", "r/i:1", "4", "trainer")
    assert (options.poll_interval, options.failure_lines, options.shared_volume_claim) == (
        2.5, 7, None)
    assert options.kueue_queue == "team-a"
    assert k8s.KubernetesOptions.from_env({}) == k8s.KubernetesOptions()


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_every_pod_gets_the_runs_keras_backend_before_it_imports_keras(backend):
    _, _, (_, _, job) = make("gpu", 2, backend=backend)
    env = {e["name"]: e.get("value") for e in container(job)["env"]}
    assert env["KERAS_BACKEND"] == backend
    with pytest.raises(ConfigError, match="KERAS_BACKEND"):  # the run's setting decides
        k8s.KubernetesOptions(env={"KERAS_BACKEND": "torch"})


def test_the_options_env_names_the_address_the_pods_reach_mlflow_by():
    """``with_tracking``: the worker's tracking server is handed to the pods, unless the
    options' ``env`` says how pods reach it (a cluster-internal address wins)."""
    from training.launch.kubernetes.options import with_tracking

    plain = k8s.KubernetesOptions()
    assert with_tracking(plain, "https://mlflow.example.org").env == {
        "TRAINING_MLFLOW_TRACKING_URI": "https://mlflow.example.org"}
    inside = k8s.KubernetesOptions(env={"TRAINING_MLFLOW_TRACKING_URI":
                                        "http://mlflow.mlops.svc:5000"})
    assert with_tracking(inside, "https://mlflow.example.org") is inside
    assert with_tracking(plain, "/data/mlflow") is plain and with_tracking(plain, "") is plain
