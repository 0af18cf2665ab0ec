"""The DAG's steps: one operator each, one library call each.

``StageOperator`` stages the dataset (``training.data.staging``); ``TrainOperator``
(``operators.py``) launches training on it. ``EvaluateOperator``, ``PublishOperator``
and ``PromoteOperator`` take what the step before produced from its XCom (template
fields holding ``XComArg``s, which also wire the dependencies: the staged dataset, the
run directory, the evaluation), build the run's validated config from the params, open
the deployment's registry and call ``training.pipeline``.

Each carries a "Model version" extra link (in the task's Details tab): the version
on the Models page (``/models/#<model>/<version>`` under the path of ``[api]
base_url``, so it opens on whatever host the UI was reached by), from which the page
links back to the Airflow run. The operator pushes the version it works on as XCom ``model_version``
before it does anything, so the link exists even when the step fails or is skipped;
Airflow 3 computes extra links in the task process when the task ends and stores them
as XCom, so the api-server runs none of this code.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperator, BaseOperatorLink

from training_airflow.params import aws_conn_id, config_for_run

VERSION_XCOM = "model_version"


def models_page_url(model_name: str, version: str) -> str:
    """The version's row on the Models page, under the path of ``[api] base_url``."""
    from airflow.configuration import conf

    root = urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    return f"{root}/models/#{quote(model_name)}/{quote(version)}"


class ModelVersionLink(BaseOperatorLink):
    """Extra link from a step to the model version it evaluated, published or promoted."""

    name = "Model version"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        # When a task ends, the task runner passes its own task instance here.
        pull = getattr(ti_key, "xcom_pull", None)
        found = pull(task_ids=ti_key.task_id, key=VERSION_XCOM) if pull else None
        if not isinstance(found, dict):
            return ""
        return models_page_url(found["model_name"], found["version"])


class _ModelStep(BaseOperator):
    """Config and registry for one DAG run's step; subclasses say what the step does."""

    operator_extra_links = (ModelVersionLink(),)

    def execute(self, context: Any) -> Any:
        from training_airflow.quiet import stderr_without_noise
        from training_airflow.store import open_registry

        cfg = config_for_run(context["params"], context["run_id"])
        context["ti"].xcom_push(key=VERSION_XCOM,
                                value={"model_name": cfg.model_name, "version": cfg.run_id})
        with stderr_without_noise():  # TensorFlow loads here on a CPU-only worker
            return self.step(cfg, open_registry(cfg, aws_conn_id()), context)

    def step(self, cfg: Any, registry: Any, context: Any) -> Any:
        raise NotImplementedError


class StageOperator(BaseOperator):
    """Stages the run's dataset once (a cache hit afterwards); XCom: the staged dataset,
    also the ``extra`` of the task's outlet Assets."""

    ui_color = "#e5dbff"

    def execute(self, context: Any) -> dict[str, Any]:
        from training.data import staging
        from training_airflow.quiet import stderr_without_noise

        cfg = config_for_run(context["params"], context["run_id"])
        with stderr_without_noise():  # tensorflow-datasets loads TensorFlow
            staged = staging.stage(cfg.dataset).to_dict()
        for asset in self.outlets:
            context["outlet_events"][asset].extra = staged
        return staged


class EvaluateOperator(_ModelStep):
    """The new model against production on the same test split; the decision."""

    template_fields = ("staged", "trained")
    ui_color = "#d0ebff"

    def __init__(self, *, staged: Any, trained: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.trained = staged, trained

    def step(self, cfg: Any, registry: Any, context: Any) -> dict[str, Any]:
        from training import pipeline
        from training.data.staging import StagedDataset

        evaluation = pipeline.evaluate(cfg, StagedDataset.from_dict(self.staged), registry,
                                       run_dir=self.trained["run_dir"])
        return {"version": evaluation["version"], "decision": evaluation["decision"],
                "accuracy": evaluation["challenger"]["accuracy"],
                "champion": evaluation["champion"], "run_dir": self.trained["run_dir"]}


class PublishOperator(_ModelStep):
    """The run's model as an immutable version, recording the Airflow run it came from."""

    template_fields = ("evaluation",)
    ui_color = "#d3f9d8"

    def __init__(self, *, evaluation: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.evaluation = evaluation

    def step(self, cfg: Any, registry: Any, context: Any) -> dict[str, Any]:
        from training import pipeline

        dag_run = context["dag_run"]
        source = {"dag_id": dag_run.dag_id, "run_id": dag_run.run_id}
        return pipeline.publish(cfg, registry, created=dag_run.run_after.isoformat(),
                                source=source, run_dir=self.evaluation["run_dir"])


class PromoteOperator(_ModelStep):
    """Moves the production pointer; skipped, with the reasons, when the model lost."""

    template_fields = ("published",)
    ui_color = "#fff3bf"

    def __init__(self, *, published: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.published = published

    def step(self, cfg: Any, registry: Any, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from training import pipeline

        result = pipeline.promote(cfg, registry, at=context["dag_run"].run_after.isoformat())
        if not result["promoted"]:
            raise AirflowSkipException("not promoted: " + "; ".join(result["reasons"]))
        for asset in self.outlets:
            context["outlet_events"][asset].extra = {**self.published,
                                                     "forced": result["forced"]}
        return result
