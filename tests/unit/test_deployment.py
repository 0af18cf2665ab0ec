"""The deployment's settings are read in one place, and a store URI is parsed once."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.deployment import Deployment
from training.errors import ConfigError, StorageError
from training.registry import open_store
from training.registry.local import FileStore
from training.registry.uri import StoreURI, is_s3


def test_defaults_hang_off_the_data_dir_and_airflow_home(tmp_path):
    deployment = Deployment.from_env({"AIRFLOW_HOME": str(tmp_path)})
    data = tmp_path / "training"
    assert deployment.data_dir == data
    assert deployment.run_settings() == {"staging_dir": str(data / "datasets"),
                                         "output_dir": str(data / "runs"),
                                         "store_uri": str(data / "store")}
    assert (deployment.incoming_dir, deployment.data_uri) == (str(data / "incoming"),
                                                              str(data / "labelled"))
    assert (deployment.aws_conn_id, deployment.kubernetes_conn_id) == ("aws_default",
                                                                       "kubernetes_default")
    assert deployment.schedule == "0 3 * * *"
    assert not deployment.store.is_s3
    assert (deployment.alert_email_conn_id, deployment.alert_webhook_conn_id) == (
        "training_alerts_email", "training_alerts_webhook")


def test_every_variable_is_read_and_empty_counts_as_unset(tmp_path):
    env = {"TRAINING_DATA_DIR": str(tmp_path), "TRAINING_STAGING_DIR": "",
           "TRAINING_OUTPUT_DIR": "/runs", "TRAINING_STORE_URI": "s3://models/registry/",
           "TRAINING_MAX_VERSION_MB": "20", "TRAINING_AWS_CONN_ID": "store",
           "TRAINING_K8S_CONN_ID": "k8s", "TRAINING_K8S_NAMESPACE": "ml",
           "TRAINING_GPU_QUEUE": "a100", "TRAINING_TPU_QUEUE": "", "TRAINING_SCHEDULE": "",
           "TRAINING_ALERT_EMAIL_CONN_ID": "team_mail", "TRAINING_ALERT_WEBHOOK_CONN_ID": "",
           "UNRELATED": "x"}
    deployment = Deployment.from_env(env)
    assert deployment.run_settings() == {"staging_dir": str(tmp_path / "datasets"),
                                         "output_dir": "/runs",
                                         "store_uri": "s3://models/registry/",
                                         "max_version_mb": 20}
    assert (deployment.store.bucket, deployment.store.path) == ("models", "registry")
    assert deployment.store.is_s3
    assert (deployment.aws_conn_id, deployment.kubernetes_conn_id) == ("store", "k8s")
    assert deployment.kubernetes_env == {"TRAINING_K8S_CONN_ID": "k8s",
                                         "TRAINING_K8S_NAMESPACE": "ml"}
    assert [deployment.queue_for(a) for a in ("gpu", "tpu", "cpu", None)] == [
        "a100", "tpu", None, None]
    assert deployment.schedule == ""  # set and empty: no cron
    assert (deployment.alert_email_conn_id, deployment.alert_webhook_conn_id) == (
        "team_mail", "training_alerts_webhook")  # empty: the default


@pytest.mark.parametrize("env, message", [
    ({"TRAINING_MAX_VERSION_MB": "2.5"},
     "TRAINING_MAX_VERSION_MB must be a whole number of MiB, got '2.5'"),
    ({"TRAINING_STORE_URI": "gs://bucket/models"},
     "TRAINING_STORE_URI scheme must be s3:// or file:// (or a plain path), "
     "got 'gs://bucket/models'"),
    ({"TRAINING_STORE_URI": "s3:///models"},
     "TRAINING_STORE_URI: an s3:// URI needs a bucket name, got 's3:///models'"),
])
def test_a_bad_variable_is_refused_with_its_name_and_value(env, message):
    with pytest.raises(ConfigError) as caught:
        Deployment.from_env(env)
    assert str(caught.value) == message


@pytest.mark.parametrize("text, parsed", [
    ("s3://bucket", ("s3", "bucket", "")),
    ("s3://bucket/a/b/", ("s3", "bucket", "a/b")),
    ("file:///srv/models", ("file", "", "/srv/models")),
    ("file://localhost/srv/models", ("file", "", "/srv/models")),
    ("var/store", ("file", "", "var/store")),
    ("C:/store", ("file", "", "C:/store")),
])
def test_store_uris_parse_into_scheme_bucket_and_path(text, parsed):
    uri = StoreURI.parse(text)
    assert (uri.scheme, uri.bucket, uri.path) == parsed
    assert str(uri) == text
    assert uri.is_s3 == is_s3(text) == (parsed[0] == "s3")


@pytest.mark.parametrize("text", ["", None, "http://host/x", "file://host/x"])
def test_other_uris_are_refused(text):
    with pytest.raises(StorageError, match=r"store URI"):
        StoreURI.parse(text)


def test_open_store_takes_a_parsed_uri(tmp_path: Path):
    store = open_store(StoreURI.parse(f"file://{tmp_path}"))
    assert isinstance(store, FileStore)
    store.put_bytes("k", b"v")
    assert (tmp_path / "k").read_bytes() == b"v"


def test_the_deadline_is_read_alone_and_a_bad_one_names_the_variable():
    from datetime import timedelta

    from training.deployment import deadline_from_env

    assert deadline_from_env({}) == timedelta(hours=6)
    assert deadline_from_env({"TRAINING_DEADLINE_MINUTES": "90",
                              "TRAINING_STORE_URI": "gs://typo"}) == timedelta(minutes=90)
    assert deadline_from_env({"TRAINING_DEADLINE_MINUTES": ""}) is None  # no deadline
    for bad in ("0", "1.5", "six hours"):
        with pytest.raises(ConfigError, match=rf"TRAINING_DEADLINE_MINUTES must be a whole "
                                              rf"number of minutes from 1 .* got '{bad}'"):
            deadline_from_env({"TRAINING_DEADLINE_MINUTES": bad})


# This round's settings: the tracking URI, serving's retention, retry delay, deferral.

@pytest.mark.parametrize("env, expected", [
    ({}, ""),
    ({"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}, "http://127.0.0.1:5000"),
    ({"MLFLOW_TRACKING_URI": "http://a:5000", "TRAINING_MLFLOW_TRACKING_URI": "http://b:1"},
     "http://b:1"),
    ({"TRAINING_MLFLOW_TRACKING_URI": "sqlite:////srv/mlflow.db"}, "sqlite:////srv/mlflow.db"),
    ({"TRAINING_MLFLOW_TRACKING_URI": "/srv/mlruns"}, "/srv/mlruns"),
    ({"TRAINING_MLFLOW_TRACKING_URI": "https://user@mlflow.team:443"},
     "https://user@mlflow.team:443"),
])
def test_the_tracking_uri_is_off_unless_set(env, expected):
    from training.deployment import tracking_uri_from_env

    assert tracking_uri_from_env(env) == expected
    assert Deployment.from_env(env).tracking_uri == expected


@pytest.mark.parametrize("value, says", [
    ("mlflow.team:5000", "must be an http(s)://host[:port] tracking server"),
    ("http://", "must be an http(s)://host[:port]"),
    ("http://host:port", "is not a URI"),
    ("https://me:s3cret@mlflow.team", "must not hold a password"),
])
def test_a_tracking_uri_that_cannot_work_names_the_setting(value, says):
    from training.deployment import tracking_uri_from_env

    with pytest.raises(ConfigError) as caught:
        tracking_uri_from_env({"MLFLOW_TRACKING_URI": value})
    assert "MLFLOW_TRACKING_URI" in str(caught.value) and says in str(caught.value)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("value, expected", [("", True), ("true", True), ("On", True),
                                             ("0", False), ("no", False), ("false", False)])
def test_deferrable_reads_booleans(value, expected):
    from training.deployment import deferrable_from_env

    assert deferrable_from_env({"TRAINING_DEFERRABLE": value}) is expected


def test_deferrable_refuses_a_word_that_is_not_a_boolean():
    from training.deployment import deferrable_from_env

    with pytest.raises(ConfigError, match="TRAINING_DEFERRABLE must be a boolean.*'maybe'"):
        deferrable_from_env({"TRAINING_DEFERRABLE": "maybe"})


@pytest.mark.parametrize("name, read", [
    ("TRAINING_SERVING_KEEP", lambda env: Deployment.from_env(env).serving_keep),
    ("TRAINING_RETRY_DELAY_SECONDS", lambda env: __import__(
        "training.deployment", fromlist=["x"]).retry_delay_from_env(env).total_seconds()),
])
def test_whole_number_settings(name, read):
    assert read({name: "7"}) == 7
    assert read({}) in (5, 60)
    for bad in ("0", "-2", "five", "1.5"):
        with pytest.raises(ConfigError, match=f"{name} must be a whole number .* got '{bad}'"):
            read({name: bad})
