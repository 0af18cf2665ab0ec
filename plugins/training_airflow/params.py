"""The trigger form, generated from the library's config schema.

``dag_params()`` turns every config field that an operator sets (everything but the
deployment's paths and store) into an Airflow ``Param`` with the field's type, default,
bounds, enum, description and section. ``config_for_run()`` maps a run's params back
onto a validated ``RunConfig``. Both walk ``training.config.flat_fields()``, so the
form and the library cannot drift.

Two things make the form usable in Airflow 3's UI:

- A field that is empty by default (``dataset_version``, ``devices``, ``tpu``,
  ``model_name``) is ``[type, "null"]`` with a ``null`` default: the UI marks every
  non-nullable field as required and refuses to submit it empty. Empty or null means
  "not set" (the library's default).
- A field with a pattern carries it as a JSON-Schema ``format`` whose name is the rule
  in words (``register_formats()`` adds the checks to jsonschema's ``FormatChecker``):
  a refused value then reads ``'a b' is not a 'registry name of 1 to 128 letters, ...'``
  instead of a regular expression. The checks are registered wherever params are
  validated: on import of this module (DAG parsing, ``airflow dags test``, tasks) and
  in the api-server through the ``training_form`` plugin.

Deployment settings (the paths, the store, its size limit) are not on the form: they
come from ``training.deployment.Deployment``, built from the environment of the Airflow
components when a task runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Param

from training.config import DEVICE_PATTERN, FieldSpec, RunConfig, flat_fields, property_schema
from training.config.run import check_known
from training.deployment import Deployment
from training.errors import ConfigError
from training.layout import as_name

SECTION_TITLES = {
    "dataset": "Dataset",
    "validation": "Data validation",
    "model": "Model",
    "fit": "Training",
    "runtime": "Hardware and distribution",
    "promotion": "Promotion policy",
    "storage": "Model registry",
    "sweep": "Hyperparameter sweep",
}


def form_fields() -> list[FieldSpec]:
    """The config fields shown in the trigger form."""
    return [s for s in flat_fields() if not s.deployment]


DEVICE_FORMAT = "device name like /gpu:0 or /cpu:0"
# Form labels where "the key with spaces" reads badly.
TITLES = {"lr_scaling": "Learning-rate scaling", "min_lr": "Minimum learning rate",
          "num_gpus": "Number of GPUs", "tpu": "TPU name", "jit_compile": "XLA (jit_compile)",
          "backup_interval_s": "Backup interval (s)", "monitor": "Monitored metric",
          "all_reduce": "All-reduce implementation",
          "gradient_pack_mb": "Gradient pack size (MiB)", "backend": "Keras backend",
          "model_parallel": "Model parallel (devices per model)"}


def format_name(spec: FieldSpec) -> str:
    """The form's ``format`` for a field with a pattern: its rule, as a noun phrase."""
    return (spec.says or "").removeprefix("empty, or ").removeprefix("a ")


def _format_checks() -> dict[str, Any]:
    checks = {}
    for spec in form_fields():
        if "pattern" in spec.rules:
            pattern, optional = spec.rules["pattern"], spec.optional
            checks[format_name(spec)] = (
                lambda v, p=pattern, o=optional: not isinstance(v, str)
                or (o and v == "") or re.fullmatch(p, v) is not None)
    checks[DEVICE_FORMAT] = lambda v: not isinstance(v, str) or re.fullmatch(DEVICE_PATTERN, v)
    model = next(spec for spec in form_fields() if spec.path == "model.name")
    checks[format_name(model)] = _is_model
    return checks


def _is_model(value: Any) -> bool:
    """The form refuses a model name that no model has (a built-in or installed one; a
    module:function reference is checked when the run starts, where it is imported)."""
    from training.train.models import REFERENCE, names

    return not isinstance(value, str) or value in names() or bool(REFERENCE.match(value))


def register_formats() -> None:
    """Teach jsonschema's FormatChecker (what Airflow validates params with) our formats."""
    from jsonschema import FormatChecker

    for name, check in _format_checks().items():
        FormatChecker.checkers[name] = (check, ())


def _param(spec: FieldSpec) -> Param:
    schema = property_schema(spec)
    default, description = schema.pop("default"), schema.pop("description")
    if spec.optional:
        default = None
        schema["type"] = [spec.type, "null"]
    if "pattern" in schema:
        schema["format"] = format_name(spec)
        del schema["pattern"]
    if spec.type == "array":
        schema["items"] = {"type": "string", "format": DEVICE_FORMAT}
    if spec.path == "model.name":  # a text field that suggests the models there are
        from training.train.models import names

        schema["examples"] = names()
    title = TITLES.get(spec.key, spec.key.replace("_", " ").capitalize())
    return Param(default, title=title,
                 description=description, section=SECTION_TITLES[spec.section], **schema)


def dag_params() -> dict[str, Param]:
    return {spec.key: _param(spec) for spec in form_fields()}


def run_id_for(airflow_run_id: str) -> str:
    """A version id that follows ``training.layout``'s name rule, derived from the Airflow
    run id (stable across retries): ``training.layout.as_name``."""
    return as_name(airflow_run_id)


def config_for_run(params: Mapping[str, Any], airflow_run_id: str,
                   deployment: Deployment | None = None) -> RunConfig:
    """The validated RunConfig of one DAG run: form params + ``deployment`` (default:
    this process's, ``Deployment.from_env``) + run id.

    Unknown keys in the run's conf are errors that name the key and list the allowed
    ones, and so is a deployment setting in the conf: ``AirflowFailException`` (no
    retries) carrying the library's ``ConfigError``.
    """
    from airflow.sdk.exceptions import AirflowFailException

    try:
        settable = {spec.key: spec for spec in form_fields()}
        for spec in flat_fields():
            if spec.deployment and spec.key in params:
                raise ConfigError(f"{spec.key} is set by the deployment's environment, not by "
                                  f"a run's conf, got {params[spec.key]!r}")
        check_known(params, settable, "conf key", "a run's conf may set")
        # Empty or null in an optional field means "not set": the library's default.
        values = {k: v for k, v in params.items()
                  if not (settable[k].optional and v in ("", None, [], {}))}
        deployment = deployment or Deployment.from_env()
        return RunConfig.from_flat({**values, **deployment.run_settings(),
                                    "run_id": run_id_for(airflow_run_id)})
    except ConfigError as exc:
        # Airflow 3.3 lets conf keys the form does not declare through; a retry cannot
        # fix a bad conf, so the task fails at once instead of retrying with backoff.
        raise AirflowFailException(f"invalid run configuration: {exc}") from exc


def run_day(context: Mapping[str, Any]) -> str:
    """The last day of data a run covers. A run triggered by ``labelled_data`` events
    covers the latest partition they landed (their ``extra``'s ``partition``); any other
    run, the last day that is over when its data interval ends (a nightly run at 03:00
    covers yesterday; a manual run, whose interval ends when it runs, the day before).
    From the run, never the clock."""
    from datetime import timedelta

    from training.data.sources.images import PARTITION

    landed = [extra["partition"][3:]
              for events in (context.get("triggering_asset_events") or {}).values()
              for extra in (getattr(event, "extra", None) for event in events)
              if isinstance(extra, dict) and PARTITION.match(str(extra.get("partition")))]
    if landed:
        return max(landed)
    end = context.get("data_interval_end") or context["dag_run"].run_after
    return (end.date() - timedelta(days=1)).isoformat()


def config_for(context: Mapping[str, Any], deployment: Deployment | None = None) -> RunConfig:
    """``config_for_run`` for a task's context: a team's own data (``data_source``
    images or tfrecord) without ``data_until`` gets the run's day (``run_day``)."""
    params = dict(context["params"])
    if params.get("data_source", "catalog") != "catalog" and not params.get("data_until"):
        params["data_until"] = run_day(context)
    return config_for_run(params, context["run_id"], deployment)


def form_markdown() -> str:
    """The trigger form as a Markdown table, by section (pasted into docs/airflow.md)."""
    rows = ["| section | field (conf key) | type | default | allowed |", "|---|---|---|---|---|"]
    for spec in sorted(form_fields(), key=lambda s: list(SECTION_TITLES).index(s.section)):
        allowed = ("device names like /gpu:0 or /cpu:0, one per line in the form"
                   if spec.type == "array" else spec.allowed)
        default = "empty" if spec.optional else f"`{json.dumps(spec.default)}`"
        rows.append(f"| {SECTION_TITLES[spec.section]} | `{spec.key}` | {spec.type} "
                    f"| {default} | {allowed} |")
    return "\n".join(rows)


register_formats()

if __name__ == "__main__":
    print(form_markdown())
