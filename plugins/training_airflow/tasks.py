"""The DAG's steps: one operator each, one library call each.

- ``StageOperator``: ``training.data.staging.stage``; XCom: the staged dataset.
- ``ValidateOperator``: ``training.data.gate.validate_data``: skipped when nothing is
  new, failed with every reason when the data fails a check; XCom: its statistics.
- ``TrainOperator``: the run's launcher (``launchers.py``: a subprocess here, or a Job on
  Kubernetes) trains on the staged dataset it is handed; XCom: the run directory.
- ``EvaluateOperator``, ``PublishOperator``, ``PromoteOperator``: ``training.pipeline``'s
  evaluate, publish and promote on the run directory and evaluation they are handed,
  with the deployment's registry.

Every step takes what the step before produced from its XCom (template fields holding
``XComArg``s, which also wire the dependencies) and builds the run's validated config
from the params (``params.config_for``); it never re-derives a path from its own
worker's environment. The model steps carry the "Model version" extra link
(``links.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

from airflow.sdk import BaseOperator

from training_airflow.links import VERSION_XCOM, ModelVersionLink
from training_airflow.params import aws_conn_id, config_for

SKIP_XCOM = "skipped_because"  # validate_data: why the run did not train


class _ModelStep(BaseOperator):
    """Config and registry for one DAG run's step; subclasses say what the step does."""

    operator_extra_links = (ModelVersionLink(),)

    def execute(self, context: Any) -> Any:
        from training_airflow.quiet import stderr_without_noise
        from training_airflow.store import open_registry

        cfg = config_for(context)
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
        from training_airflow.store import s3_options

        cfg = config_for(context)
        with stderr_without_noise():  # tensorflow-datasets loads TensorFlow
            staged = staging.stage(cfg.dataset,
                                   s3_options(cfg.dataset.uri, aws_conn_id())).to_dict()
        for asset in self.outlets:
            context["outlet_events"][asset].extra = staged
        return staged


class TrainOperator(BaseOperator):
    """Train the run's model on the staged dataset (``stage_dataset``'s XCom) with the
    launcher its params ask for; XCom: the run dir."""

    template_fields = ("staged",)
    ui_color = "#ffd8a8"

    def __init__(self, *, staged: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged = staged
        self.child: subprocess.Popen | None = None
        self.stop: Callable[[], None] | None = None  # set by launchers with their own kill

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = config_for(context)
        from training_airflow.launchers import LAUNCHERS

        launch = LAUNCHERS[cfg.runtime.launcher]
        self.log.info("launching %s training for run %s (%s, %d worker(s))",
                      cfg.runtime.launcher, cfg.run_id, cfg.runtime.accelerator,
                      cfg.runtime.workers)
        return launch(self, cfg, context)

    def on_kill(self) -> None:
        if self.stop is not None:
            self.stop()
        elif self.child is not None and self.child.poll() is None:
            self.log.info("sending SIGTERM to the training process group")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, signal.SIGTERM)


class ValidateOperator(BaseOperator):
    """Checks the staged data before training (``training.data.gate``): skipped, with
    the reason, when there is nothing new; failed at once (no retry can fix data) with
    every reason when a check fails. XCom: the statistics and the verdict."""

    template_fields = ("staged",)
    ui_color = "#f3d9fa"

    def __init__(self, *, staged: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged = staged

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from training.data import gate
        from training.data.staging import StagedDataset
        from training.errors import ValidationError
        from training_airflow.quiet import stderr_without_noise
        from training_airflow.store import open_registry

        cfg = config_for(context)
        try:
            with stderr_without_noise():
                checked = gate.validate_data(cfg, StagedDataset.from_dict(self.staged),
                                             open_registry(cfg, aws_conn_id()))
        except ValidationError as exc:
            raise AirflowFailException(str(exc)) from exc
        if checked["skip"]:
            context["ti"].xcom_push(key=SKIP_XCOM, value=checked["reason"])
            raise AirflowSkipException(checked["reason"])
        return checked


class EvaluateOperator(_ModelStep):
    """The new model against production on the same test split; the decision."""

    template_fields = ("staged", "trained", "validated")
    ui_color = "#d0ebff"

    def __init__(self, *, staged: Any, trained: Any, validated: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.trained, self.validated = staged, trained, validated

    def step(self, cfg: Any, registry: Any, context: Any) -> dict[str, Any]:
        from training import pipeline
        from training.data.staging import StagedDataset
        from training_airflow.store import s3_options

        evaluation = pipeline.evaluate(
            cfg, StagedDataset.from_dict(self.staged), registry,
            run_dir=self.trained["run_dir"],
            data_stats=(self.validated or {}).get("data_stats"),
            holdout_options=s3_options(cfg.promotion.holdout_uri, aws_conn_id()))
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

        result = pipeline.promote(cfg, registry, at=context["dag_run"].run_after.isoformat(),
                                  published=self.published)
        if not result["promoted"]:
            raise AirflowSkipException("not promoted: " + "; ".join(result["reasons"]))
        for asset in self.outlets:
            context["outlet_events"][asset].extra = {**self.published,
                                                     "forced": result["forced"]}
        return result
