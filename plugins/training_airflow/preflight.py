"""``python -m training_airflow.preflight``: a deployment's connections, checked before its
components start.

A wrong database password, a broker that refuses its password or a store secret that
does not match make Airflow's components fail later, each with a wall of traceback in
its own log (a scheduler that restarts forever, a worker that never takes a task, a
``publish`` that fails after hours of training). This checks each setting once, with the
settings exactly as the components read them (the ``AIRFLOW__...`` variables, the
``AIRFLOW_CONN_...`` store connection, ``TRAINING_STORE_URI``), and says what is wrong
in one line that names the setting:

    error: AIRFLOW__CELERY__BROKER_URL: redis://:***@127.0.0.1:8085/0 refused the
    password (invalid username-password pair or user is disabled.)

``./dev stack`` runs it before ``airflow db migrate``; a deployment can run it as an init
step (exit code 1 when a check fails). Only what is set is checked: a SQLite database, no
Celery, a local store need nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit, urlunsplit

from training.deployment import Deployment
from training.errors import ConfigError

TIMEOUT_S = 5


class PreflightError(RuntimeError):
    """One setting that does not work, said in one line (``setting: what``)."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if "FATAL" in line), lines[0] if lines else
                type(exc).__name__)


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username or ''}:***@"
    host = parts.hostname or ""
    netloc = user + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def check_database(setting: str, url: str) -> str:
    import sqlalchemy

    if url.startswith("db+"):  # a Celery result backend
        url = url[3:]
    connect_args = {} if url.startswith("sqlite") else {"connect_timeout": TIMEOUT_S}
    try:
        engine = sqlalchemy.create_engine(url, connect_args=connect_args)
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("select 1"))
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - every driver's error, said in one line
        raise PreflightError(setting, f"cannot connect to {masked(url)}: "
                                      f"{_first_line(exc)}") from None
    return f"{setting}: {masked(url)} answers"


def check_broker(setting: str, url: str) -> str:
    if not url.startswith(("redis://", "rediss://")):
        return f"{setting}: {masked(url)} not checked (only Redis brokers are)"
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_S,
                             socket_timeout=TIMEOUT_S).ping()
    except redis.exceptions.AuthenticationError as exc:
        raise PreflightError(setting, f"{masked(url)} refused the password ({exc})") from None
    except redis.exceptions.RedisError as exc:
        raise PreflightError(setting, f"cannot reach {masked(url)}: {_first_line(exc)}") \
            from None
    return f"{setting}: {masked(url)} answers"


def _connection(env: Mapping[str, str], conn_id: str) -> tuple[str, dict]:
    """The store connection's variable name and fields, from the environment."""
    name = f"AIRFLOW_CONN_{conn_id.upper()}"
    value = env.get(name)
    if value is None:
        return name, {}
    if value.lstrip().startswith("{"):
        try:
            fields = json.loads(value)
        except ValueError as exc:
            raise PreflightError(name, f"is not valid JSON ({exc})") from None
        extra = fields.get("extra") or {}
        return name, {"login": fields.get("login"), "password": fields.get("password"),
                      "extra": json.loads(extra) if isinstance(extra, str) else extra}
    from airflow.models.connection import Connection

    parsed = Connection(conn_id=conn_id, uri=value)
    return name, {"login": parsed.login, "password": parsed.password,
                  "extra": parsed.extra_dejson}


def check_store(env: Mapping[str, str]) -> str:
    try:
        deployment = Deployment.from_env(env)
    except ConfigError as exc:  # the message starts with the variable's name
        setting, _, what = str(exc).partition(" ")
        raise PreflightError(setting.rstrip(":"), what) from None
    store, store_uri = deployment.store, deployment.store.text
    if not store.is_s3:
        return f"TRAINING_STORE_URI: {store_uri} is a local store"
    import boto3
    import botocore.exceptions
    from botocore.config import Config

    conn_id = deployment.aws_conn_id
    setting, fields = _connection(env, conn_id)
    extra = fields.get("extra") or {}
    endpoint = extra.get("endpoint_url") or env.get("AWS_ENDPOINT_URL_S3") \
        or env.get("AWS_ENDPOINT_URL")
    bucket, prefix = store.bucket, store.path
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name=extra.get("region_name"),
        aws_access_key_id=fields.get("login"), aws_secret_access_key=fields.get("password"),
        config=Config(connect_timeout=TIMEOUT_S, read_timeout=TIMEOUT_S,
                      retries={"max_attempts": 1}))
    where = endpoint or "AWS S3"
    if not fields:
        setting = "the store's credentials (boto3's default chain)"
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except botocore.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise PreflightError(setting, f"{where} refused to list {store_uri} with the key "
                                      f"{fields.get('login')!r}: {code}") from None
    except botocore.exceptions.BotoCoreError as exc:
        raise PreflightError(setting, f"cannot reach {where} for {store_uri}: {exc}") \
            from None
    return f"{setting}: {store_uri} on {where} lists with the key {fields.get('login')!r}"


def check(env: Mapping[str, str]) -> Iterator[str]:
    """Every check that applies to ``env``, a line each as it passes; PreflightError at
    the first that fails."""
    database = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
    if database:
        yield check_database("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", database)
    if env.get("AIRFLOW__CORE__EXECUTOR", "").endswith("CeleryExecutor"):
        for setting, checker in (("AIRFLOW__CELERY__BROKER_URL", check_broker),
                                 ("AIRFLOW__CELERY__RESULT_BACKEND", check_database)):
            if env.get(setting):
                yield checker(setting, env[setting])
    yield check_store(env)


def main() -> int:
    import os

    try:
        for line in check(os.environ):
            print(f"ok: {line}", flush=True)
    except PreflightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
