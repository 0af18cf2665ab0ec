"""Object-store access from Airflow: endpoint and credentials from a connection.

For an ``s3://`` store, the amazon provider's ``AwsBaseHook`` reads the connection
(``aws_default`` unless ``TRAINING_AWS_CONN_ID`` names another): login/password or the
role it assumes, ``endpoint_url`` and ``region_name`` from its extra, or boto3's default
chain when the connection holds no keys. The secrets are registered with Airflow's
secrets masker before anything can log them, and they reach the training subprocess
only through its environment, never through XCom, templates or the command line.
"""

from __future__ import annotations

from typing import Any

from training.registry.s3 import S3Options
from training.registry.uri import is_s3


def s3_options(store_uri: str, conn_id: str) -> S3Options | None:
    """S3Options from the Airflow connection; None for a local store."""
    if not is_s3(store_uri):
        return None
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    from airflow.sdk.log import mask_secret

    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    credentials = hook.get_credentials()
    for secret in (credentials.secret_key, credentials.token):
        if secret:
            mask_secret(secret)
    wrapper = hook.conn_config
    return S3Options(
        endpoint_url=wrapper.get_service_endpoint_url("s3"),
        region_name=wrapper.region_name,
        aws_access_key_id=credentials.access_key,
        aws_secret_access_key=credentials.secret_key,
        aws_session_token=credentials.token,
    )


def subprocess_env(options: S3Options | None) -> dict[str, str]:
    """Environment variables that hand the store's credentials to a child process."""
    if options is None:
        return {}
    env = {
        "AWS_ACCESS_KEY_ID": options.aws_access_key_id,
        "AWS_SECRET_ACCESS_KEY": options.aws_secret_access_key,
        "AWS_SESSION_TOKEN": options.aws_session_token,
        "AWS_ENDPOINT_URL_S3": options.endpoint_url,
        "AWS_DEFAULT_REGION": options.region_name,
    }
    return {k: v for k, v in env.items() if v}


def child_env(cfg: Any, conn_id: str) -> dict[str, str]:
    """The credentials a step's child process gets, for the run's first s3:// location
    (the store, the backbone's weights, the holdout, the team's data): one connection."""
    uris = (cfg.storage.store_uri, cfg.model.weights, cfg.promotion.holdout_uri,
            cfg.dataset.uri)
    return subprocess_env(s3_options(next((u for u in uris if is_s3(u)), ""), conn_id))


def open_registry(cfg: Any, conn_id: str) -> Any:
    """The model registry on the run's store, with the connection's credentials, and
    what follows its pointer (the serving layout, the MLflow mirror)."""
    from training.tracking import tracked_registry

    return tracked_registry(cfg.storage.store_uri, s3_options(cfg.storage.store_uri, conn_id))
