"""The DAG's steps: one operator each, one library call each.

No step imports TensorFlow or tensorflow-datasets in the Airflow task process: what
needs them runs as ``python -m training ...`` in a child process (``launchers.py``), so
a task costs its process start and its work, not a 10-16 s import. Every step logs a
timing line first and last and leaves a record of what it did in the run directory
(``records.py``, read back by ``summary.py``).

- ``StageOperator``: a cache hit found without tfds (``staging.cached``), else
  ``python -m training stage`` in a child process; XCom: the staged dataset.
- ``ValidateOperator``: ``training.data.gate.validate_data``: skipped when nothing is
  new, failed with every reason when the data fails a check; XCom: its statistics.
- ``TrainOperator``: the run's launcher (``launchers.py``: a subprocess here, or a Job on
  Kubernetes) trains on the staged dataset it is handed; the local one evaluates in the
  same process; XCom: the run directory.
- ``EvaluateOperator``: the evaluation the training process wrote, if it still stands
  (``pipeline.standing_evaluation``), else ``python -m training evaluate`` in a child.
- ``PublishOperator``, ``PromoteOperator``: ``training.pipeline``'s publish and promote
  on the run directory and evaluation they are handed, with the deployment's registry.

Every step takes what the step before produced from its XCom (template fields holding
``XComArg``s, which also wire the dependencies) and builds the run's validated config
from the params (``params.config_for``); it never re-derives a path from its own
worker's environment. The model steps carry the "Model version" extra link
(``links.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from airflow.sdk import BaseOperator

from training.deployment import Deployment
from training.launch.child import Child
from training_airflow.links import VERSION_XCOM, ModelVersionLink
from training_airflow.params import config_for

SKIP_XCOM = "skipped_because"  # validate_data: why the run did not train


class _Step(BaseOperator):
    """One step of the DAG: its library modules imported and timed, the run's config,
    a timing line first and last in the log, and a record of what it did in the run
    directory (``records.py``). Subclasses say what the step needs (``imports``) and
    does (``work``). No step imports TensorFlow or tfds: what needs them runs in a
    child process (``launchers.run_training_command``)."""

    imports: tuple[str, ...] = ()
    child: Child | None = None  # a child process the step runs (launchers.run_child)
    deployment: Deployment  # this worker's (training.deployment), read as the step starts

    def on_kill(self) -> None:
        if self.child is not None and self.child.running():
            self.log.info("sending SIGTERM to the child process group")
            self.child.stop()

    def execute(self, context: Any) -> Any:
        import importlib
        import time
        from datetime import UTC, datetime

        from airflow.sdk.exceptions import AirflowSkipException

        from training_airflow import records

        entered = datetime.now(UTC)
        began = time.perf_counter()
        for module in self.imports:
            importlib.import_module(module)
        imported = time.perf_counter() - began
        self.deployment = Deployment.from_env()
        cfg = config_for(context, self.deployment)
        ti, dag_run, run_dir = context.get("ti"), context.get("dag_run"), cfg.run_dir()
        if ti is None or dag_run is None or not self.has_dag():
            return self.work(cfg, context)  # called outside a DAG run: nothing to record
        timed = records.timing(run_dir, ti, dag_run, self.upstream_task_ids, entered,
                               imported)
        self.log.info("%s", timed.line())
        graph = {t.task_id: sorted(t.downstream_task_ids) for t in self.dag.tasks}

        def record(state: str, value: Any) -> None:
            timed.finish()
            records.write(run_dir, ti, dag_run, graph, state, value, timed)
            self.log.info("%s", timed.line())

        try:
            value = self.work(cfg, context)
        except AirflowSkipException as exc:
            record("skipped", str(exc))
            raise
        except BaseException as exc:
            record("failed", f"{type(exc).__name__}: {exc}")
            raise
        record("success", value)
        return value

    def work(self, cfg: Any, context: Any) -> Any:
        raise NotImplementedError


class _ModelStep(_Step):
    """A step on the run's model, with the deployment's registry."""

    operator_extra_links = (ModelVersionLink(),)

    def work(self, cfg: Any, context: Any) -> Any:
        from training_airflow.store import open_registry

        context["ti"].xcom_push(key=VERSION_XCOM,
                                value={"model_name": cfg.model_name, "version": cfg.run_id})
        return self.step(cfg, open_registry(cfg, self.deployment.aws_conn_id), context)

    def step(self, cfg: Any, registry: Any, context: Any) -> Any:
        raise NotImplementedError


class StageOperator(_Step):
    """Stages the run's dataset once; XCom: the staged dataset, also the ``extra`` of
    the task's outlet Assets. A cache hit is found here without tfds
    (``staging.cached``); anything to prepare is done by ``python -m training stage``
    in a child process."""

    imports = ("training.data.staging", "training_airflow.store")
    ui_color = "#e5dbff"

    def work(self, cfg: Any, context: Any) -> dict[str, Any]:
        from training.data import staging
        from training_airflow.launchers import run_training_command
        from training_airflow.store import s3_options

        staged = staging.cached(cfg.dataset,
                                s3_options(cfg.dataset.uri, self.deployment.aws_conn_id))
        if staged is not None:
            result = staged.to_dict()
        else:
            result = run_training_command(self, cfg, "stage")["staged"]
        for asset in self.outlets:
            context["outlet_events"][asset].extra = result
        return result


class TrainOperator(_Step):
    """Train the run's model on the staged dataset (``stage_dataset``'s XCom) with the
    launcher its params ask for; XCom: the run dir. The local launcher also evaluates
    in the same child process (``validate_data``'s statistics handed over), so
    TensorFlow loads once per run."""

    template_fields = ("staged", "validated")
    imports = ("training_airflow.launchers",)
    ui_color = "#ffd8a8"

    def __init__(self, *, staged: Any, validated: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.validated = staged, validated
        self.stop: Callable[[], None] | None = None  # set by launchers with their own kill

    def work(self, cfg: Any, context: Any) -> dict[str, Any]:
        from training_airflow.launchers import LAUNCHERS

        launch = LAUNCHERS[cfg.runtime.launcher]
        self.log.info("launching %s training for run %s (%s, %d worker(s))",
                      cfg.runtime.launcher, cfg.run_id, cfg.runtime.accelerator,
                      cfg.runtime.workers)
        return launch(self, cfg, context)

    def on_kill(self) -> None:
        if self.stop is not None:
            self.stop()
        else:
            super().on_kill()


class ValidateOperator(_Step):
    """Checks the staged data before training (``training.data.gate``): skipped, with
    the reason, when there is nothing new; failed at once (no retry can fix data) with
    every reason when a check fails. XCom: the statistics and the verdict."""

    template_fields = ("staged",)
    imports = ("training.data.gate", "training.data.staging", "training_airflow.store")
    ui_color = "#f3d9fa"

    def __init__(self, *, staged: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged = staged

    def work(self, cfg: Any, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from training.data import gate
        from training.data.staging import StagedDataset
        from training.errors import ValidationError
        from training_airflow.store import open_registry

        try:
            checked = gate.validate_data(cfg, StagedDataset.from_dict(self.staged),
                                         open_registry(cfg, self.deployment.aws_conn_id))
        except ValidationError as exc:
            raise AirflowFailException(str(exc)) from exc
        if checked["skip"]:
            context["ti"].xcom_push(key=SKIP_XCOM, value=checked["reason"])
            raise AirflowSkipException(checked["reason"])
        return checked


class EvaluateOperator(_ModelStep):
    """The new model against production on the same test split; the decision. The
    evaluation the training process wrote stands if nothing it depends on changed
    (``pipeline.standing_evaluation``); otherwise ``python -m training evaluate`` runs
    it again in a child process."""

    template_fields = ("staged", "trained", "validated")
    imports = ("training.pipeline", "training_airflow.store")
    ui_color = "#d0ebff"

    def __init__(self, *, staged: Any, trained: Any, validated: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.trained, self.validated = staged, trained, validated

    def step(self, cfg: Any, registry: Any, context: Any) -> dict[str, Any]:
        from training import pipeline
        from training.data.staging import StagedDataset
        from training.errors import LaunchError
        from training_airflow.launchers import run_training_command

        if os.path.realpath(self.trained["run_dir"]) != os.path.realpath(cfg.run_dir()):
            raise LaunchError(f"train reported run directory {self.trained['run_dir']}, "
                              f"this run's is {cfg.run_dir()}")
        evaluation = pipeline.published_evaluation(cfg, registry)
        if evaluation is not None:
            self.log.info("%s %s is already published; its evaluation stands",
                          cfg.model_name, cfg.run_id)
        else:
            evaluation, why = pipeline.standing_evaluation(
                cfg, StagedDataset.from_dict(self.staged), registry)
            if evaluation is not None:
                self.log.info("the evaluation stands: %s", why)
            else:
                self.log.info("evaluating (again): %s", why)
                run_training_command(self, cfg, "evaluate", staged=self.staged,
                                     data_stats=(self.validated or {}).get("data_stats"))
                evaluation = pipeline.read_evaluation(cfg)
        decision = evaluation["decision"]
        self.log.info("verdict for %s %s: %s%s; %s", cfg.model_name, cfg.run_id,
                      "promote" if decision["promote"] else "keep production",
                      " (forced)" if decision["forced"] else "", "; ".join(decision["reasons"]))
        return {"version": evaluation["version"], "decision": decision,
                "accuracy": evaluation["challenger"]["accuracy"],
                "champion": evaluation["champion"], "run_dir": self.trained["run_dir"]}


class PublishOperator(_ModelStep):
    """The run's model as an immutable version, recording the Airflow run it came from."""

    template_fields = ("evaluation",)
    imports = ("training.pipeline", "training_airflow.store")
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
    imports = ("training.pipeline", "training_airflow.store")
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
