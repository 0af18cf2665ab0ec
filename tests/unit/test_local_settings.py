"""The local stacks' settings: the environment wins, ``--port`` wins over it, and the
preflight check's one line never shows a password."""

from __future__ import annotations

import pytest

from tools.standalone import component_env
from training_airflow.preflight import PreflightError, check_database, check_store, masked


def test_the_defaults_move_with_the_port():
    env = component_env({}, None, None)
    assert env["AIRFLOW__API__PORT"] == "8080"
    assert env["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:8080"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8080/execution/"
    assert env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] == "8081"
    assert env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] == "8082"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"


def test_an_airflow_setting_in_the_environment_wins():
    env = component_env({"AIRFLOW__API__PORT": "9191", "AIRFLOW__CORE__PARALLELISM": "7",
                         "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": "9999",
                         "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"}, None, None)
    assert env["AIRFLOW__API__PORT"] == "9191"
    assert env["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:9191"
    assert env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] == "9192"
    assert env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] == "9999"
    assert env["AIRFLOW__CORE__PARALLELISM"] == "7"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"


def test_port_and_host_given_win_over_the_environment():
    env = component_env({"AIRFLOW__API__PORT": "9191", "AIRFLOW__API__HOST": "127.0.0.2",
                         "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": "9999",
                         "AIRFLOW__API__BASE_URL": "http://elsewhere:1"}, "0.0.0.0", 8300)
    assert env["AIRFLOW__API__PORT"] == "8300"
    assert env["AIRFLOW__API__HOST"] == "0.0.0.0"
    assert env["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:8300"
    assert env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] == "8301"


def test_a_port_that_is_no_number_is_refused_by_name():
    with pytest.raises(ValueError, match=r"AIRFLOW__API__PORT must be a port number, got 'x'"):
        component_env({"AIRFLOW__API__PORT": "x"}, None, None)


def test_masked_hides_only_the_password():
    assert masked("postgresql+psycopg2://airflow:s3cret@127.0.0.1:5432/airflow") == \
        "postgresql+psycopg2://airflow:***@127.0.0.1:5432/airflow"
    assert masked("redis://:pw@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert masked("sqlite:////tmp/airflow.db") == "sqlite:////tmp/airflow.db"


def test_a_database_that_does_not_answer_is_one_line_without_the_password(tmp_path):
    with pytest.raises(PreflightError) as refused:
        check_database("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
                       f"sqlite:///{tmp_path}/missing/dir/airflow.db")
    message = str(refused.value)
    assert message.startswith("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN: cannot connect to sqlite")
    assert "\n" not in message


@pytest.mark.parametrize("env, line", [
    ({"TRAINING_STORE_URI": "gs://bucket"},
     "TRAINING_STORE_URI: scheme must be s3:// or file:// (or a plain path), got 'gs://bucket'"),
    ({"TRAINING_MAX_VERSION_MB": "1e3"},
     "TRAINING_MAX_VERSION_MB: must be a whole number of MiB, got '1e3'"),
])
def test_a_wrong_store_setting_is_one_line_naming_the_variable(env, line):
    with pytest.raises(PreflightError) as refused:
        check_store(env)
    assert (refused.value.setting, str(refused.value)) == (line.split(":")[0], line)
