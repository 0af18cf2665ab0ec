"""The trigger form, generated from the library's config schema.

``dag_params()`` turns every config field that an operator sets (everything but the
deployment's paths and store) into an Airflow ``Param`` with the field's type, default,
bounds, enum, pattern, description and section. ``config_for_run()`` maps a run's
params back onto a validated ``RunConfig``. Both walk ``training.config.flat_fields()``,
so the form and the library cannot drift.

Deployment settings come from the environment of the Airflow components, read when a
task runs:

- ``TRAINING_DATA_DIR``: root of the three below (default ``$AIRFLOW_HOME/training``);
- ``TRAINING_STAGING_DIR``: staged datasets (default ``<data dir>/datasets``);
- ``TRAINING_OUTPUT_DIR``: run directories (default ``<data dir>/runs``);
- ``TRAINING_STORE_URI``: the model store, ``s3://bucket/prefix`` or a path (default
  ``<data dir>/store``);
- ``TRAINING_AWS_CONN_ID``: the Airflow connection for an ``s3://`` store (default
  ``aws_default``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow.sdk import Param

from training.config import FieldSpec, RunConfig, flat_fields, property_schema
from training.errors import ConfigError

SECTION_TITLES = {
    "dataset": "Dataset",
    "model": "Model",
    "fit": "Training",
    "runtime": "Hardware and distribution",
    "promotion": "Promotion policy",
    "storage": "Model registry",
}


def form_fields() -> list[FieldSpec]:
    """The config fields shown in the trigger form."""
    return [s for s in flat_fields() if not s.deployment]


def _param(spec: FieldSpec) -> Param:
    schema = property_schema(spec)
    default, description = schema.pop("default"), schema.pop("description")
    return Param(default, title=spec.key.replace("_", " ").capitalize(),
                 description=description, section=SECTION_TITLES[spec.section], **schema)


def dag_params() -> dict[str, Param]:
    return {spec.key: _param(spec) for spec in form_fields()}


def deployment_settings(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The deployment's paths and store, from the environment (see the module doc)."""
    home = Path(env.get("AIRFLOW_HOME", Path.home() / "airflow"))
    data = Path(env.get("TRAINING_DATA_DIR", home / "training"))
    return {
        "staging_dir": env.get("TRAINING_STAGING_DIR", os.fspath(data / "datasets")),
        "output_dir": env.get("TRAINING_OUTPUT_DIR", os.fspath(data / "runs")),
        "store_uri": env.get("TRAINING_STORE_URI", os.fspath(data / "store")),
    }


def aws_conn_id(env: Mapping[str, str] = os.environ) -> str:
    return env.get("TRAINING_AWS_CONN_ID", "aws_default")


def run_id_for(airflow_run_id: str) -> str:
    """A registry-safe version id derived from the Airflow run id (stable across retries)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", airflow_run_id).strip("-.") or "run"
    if len(cleaned) > 128:  # keep two long ids apart: cut, then a hash of the original
        digest = hashlib.sha256(airflow_run_id.encode()).hexdigest()[:8]
        cleaned = f"{cleaned[:119]}-{digest}"
    return cleaned


def config_for_run(params: Mapping[str, Any], airflow_run_id: str,
                   env: Mapping[str, str] = os.environ) -> RunConfig:
    """The validated RunConfig of one DAG run: form params + deployment + run id.

    Unknown keys in the run's conf are errors that name the key and list the allowed
    ones, and so is a deployment setting in the conf: ``AirflowFailException`` (no
    retries) carrying the library's ``ConfigError``.
    """
    from airflow.sdk.exceptions import AirflowFailException

    try:
        for spec in flat_fields():
            if spec.deployment and spec.key in params:
                raise ConfigError(f"{spec.key} is set by the deployment's environment, not by "
                                  f"a run's conf, got {params[spec.key]!r}")
        return RunConfig.from_flat({**params, **deployment_settings(env),
                                    "run_id": run_id_for(airflow_run_id)})
    except ConfigError as exc:
        # Airflow 3.3 lets conf keys the form does not declare through; a retry cannot
        # fix a bad conf, so the task fails at once instead of retrying with backoff.
        raise AirflowFailException(f"invalid run configuration: {exc}") from exc


def form_markdown() -> str:
    """The trigger form as a Markdown table, by section (pasted into the README)."""
    rows = ["| section | field (conf key) | type | default | allowed |", "|---|---|---|---|---|"]
    for spec in sorted(form_fields(), key=lambda s: list(SECTION_TITLES).index(s.section)):
        rules = spec.rules
        if "enum" in rules:
            allowed = ", ".join(f"`{v}`" for v in rules["enum"])
        elif "minimum" in rules or "exclusive_minimum" in rules:
            low = rules.get("minimum", rules.get("exclusive_minimum"))
            op = "<" if "exclusive_minimum" in rules else "<="
            allowed = f"{low} {op} x <= {rules['maximum']}"
        else:
            allowed = "name pattern" if "pattern" in rules else "any"
        default = "empty" if spec.default in ("", None, []) else f"`{json.dumps(spec.default)}`"
        rows.append(f"| {SECTION_TITLES[spec.section]} | `{spec.key}` | {spec.type} "
                    f"| {default} | {allowed} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(form_markdown())
