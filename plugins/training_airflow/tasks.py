"""The DAG's steps: one operator each, one library call each.

What every step does around its work (its imports, the deployment, the run's frozen
config, timing and records) is ``step.Step``'s; a sweep's own steps are in
``sweep_tasks.py``.

Each operator is one step of ``training.steps`` (the order, the inputs and the
"already done?" rules live there):

- ``StageOperator``: a cache hit found without tfds (``steps.stage.cached``), else
  ``python -m training stage`` in a child process; XCom: the staged dataset.
- ``ValidateOperator``: ``steps.validate.validate_data``: skipped when nothing is
  new, failed with every reason when the data fails a check; XCom: its statistics.
- ``TrainOperator``: ``launcher=local``: ``python -m training train --evaluate`` in a
  child process (training, then evaluation: TensorFlow loads once per run); another
  launcher (``launchers.py``: a Job on Kubernetes) trains on the staged dataset it is
  handed; XCom: the run directory.
- ``EvaluateOperator``: ``steps.evaluate.evaluated``: the evaluation the training
  process wrote, if it still stands, else ``python -m training evaluate`` in a child.
- ``PublishOperator``, ``PromoteOperator``: ``steps.publish`` and ``steps.promote``
  on the run directory and evaluation they are handed, with the deployment's registry.

Each hands the tracker what it produced (``tracking.py``: one MLflow run per DAG run,
when tracking is on).

Every step takes what the step before produced from its XCom (template fields holding
``XComArg``s, which also wire the dependencies), and the run's frozen config from the
first step (or from ``train``'s pick after a sweep: ``step.py``). The model steps carry
the "Model version" extra link (``links.py``).
"""

from __future__ import annotations

import os
from typing import Any

from training_airflow import tracking
from training_airflow.links import VERSION_XCOM, ModelVersionLink
from training_airflow.step import Step

SKIP_XCOM = "skipped_because"  # validate_data: why the run did not train


class _ModelStep(Step):
    """A step on the run's model, with the deployment's registry."""

    operator_extra_links = (ModelVersionLink(),)

    def work(self, cfg: Any, context: Any) -> Any:
        from training_airflow.store import open_registry

        context["ti"].xcom_push(key=VERSION_XCOM,
                                value={"model_name": cfg.model_name, "version": cfg.run_id})
        return self.step(cfg, open_registry(cfg, self.deployment.aws_conn_id), context)

    def step(self, cfg: Any, registry: Any, context: Any) -> Any:
        raise NotImplementedError


class StageOperator(Step):
    """Stages the run's dataset once; XCom: the staged dataset, also the ``extra`` of
    the task's outlet Assets. A cache hit is found here without tfds
    (``staging.cached``); anything to prepare is done by ``python -m training stage``
    in a child process."""

    imports = ("training.steps.stage", "training_airflow.store")
    builds_config = True
    ui_color = "#e5dbff"

    def work(self, cfg: Any, context: Any) -> dict[str, Any]:
        from training.steps import stage
        from training_airflow.store import s3_options

        staged = stage.cached(cfg, s3_options(cfg.dataset.uri, self.deployment.aws_conn_id))
        if staged is not None:
            result = staged.to_dict()
        else:
            result = self.run_command(cfg, "stage")["staged"]
        for asset in self.outlets:
            context["outlet_events"][asset].extra = result
        tracking.run_started(cfg, context, result)
        return result


class TrainOperator(Step):
    """Train the run's model on the staged dataset (``stage_dataset``'s XCom) with the
    launcher its params ask for; XCom: the run dir. ``launcher=local`` also evaluates
    in the same child process (``validate_data``'s statistics handed over), so
    TensorFlow loads once per run."""

    template_fields = ("staged", "validated")
    imports = ("training.launch.command", "training_airflow.store")
    ui_color = "#ffd8a8"
    hands_config = True  # after a sweep: the picked trial's (sweep_tasks.pick)

    def __init__(self, *, staged: Any, validated: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.validated = staged, validated

    def execute(self, context: Any) -> Any:
        from airflow.sdk.exceptions import AirflowSkipException

        # In a DAG run it runs after the trials however they ended (all_done), so also
        # when validate_data did not pass.
        if self.validated is None and self.has_dag() and context.get("dag_run") is not None:
            raise AirflowSkipException("validate_data did not pass: nothing to train")
        return super().execute(context)

    def work(self, cfg: Any, context: Any) -> dict[str, Any]:
        from training_airflow import sweep_tasks

        if cfg.sweep.enabled:
            from training.data.snapshot.staging import StagedDataset

            return sweep_tasks.pick(self, cfg, StagedDataset.from_dict(self.staged), context)
        self.log.info("%s %s training for run %s (%s, %d worker(s))",
                      "resuming" if self.event is not None else "launching",
                      cfg.runtime.launcher, cfg.run_id, cfg.runtime.accelerator,
                      cfg.runtime.workers)
        if cfg.runtime.launcher == "local":
            self.run_command(cfg, "train", staged=self.staged,
                             data_stats=(self.validated or {}).get("data_stats"),
                             flags=("--evaluate",))
            return {"run_id": cfg.run_id, "run_dir": os.fspath(cfg.run_dir())}
        from training_airflow.launchers import LAUNCHERS

        return LAUNCHERS[cfg.runtime.launcher](self, cfg, context)


class ValidateOperator(Step):
    """Checks the staged data before training (``training.steps.validate``): skipped, with
    the reason, when there is nothing new; failed at once (no retry can fix data) with
    every reason when a check fails. XCom: the statistics and the verdict."""

    template_fields = ("staged",)
    imports = ("training.steps.validate", "training_airflow.store")
    ui_color = "#f3d9fa"

    def __init__(self, *, staged: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged = staged

    def work(self, cfg: Any, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from training.data.snapshot.staging import StagedDataset
        from training.errors import ValidationError
        from training.steps import validate
        from training_airflow.store import open_registry

        try:
            checked = validate.validate_data(cfg, StagedDataset.from_dict(self.staged),
                                             open_registry(cfg, self.deployment.aws_conn_id))
        except ValidationError as exc:
            raise AirflowFailException(str(exc)) from exc
        if checked["skip"]:
            context["ti"].xcom_push(key=SKIP_XCOM, value=checked["reason"])
            tracking.ended(self, cfg, context, "skipped", checked["reason"])  # nothing follows
            raise AirflowSkipException(checked["reason"])
        return checked


class EvaluateOperator(_ModelStep):
    """The new model against production on the same test split; the decision. The
    evaluation the training process wrote stands if nothing it depends on changed
    (``steps.evaluate.evaluated``); otherwise ``python -m training evaluate`` runs it
    again in a child process."""

    template_fields = ("staged", "trained", "validated")
    imports = ("training.steps.evaluate", "training_airflow.store")
    ui_color = "#d0ebff"

    def __init__(self, *, staged: Any, trained: Any, validated: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.trained, self.validated = staged, trained, validated

    def step(self, cfg: Any, registry: Any, context: Any) -> dict[str, Any]:
        from training.data.snapshot.staging import StagedDataset
        from training.errors import LaunchError
        from training.steps import evaluate

        if os.path.realpath(self.trained["run_dir"]) != os.path.realpath(cfg.run_dir()):
            raise LaunchError(f"train reported run directory {self.trained['run_dir']}, "
                              f"this run's is {cfg.run_dir()}")

        data_stats = (self.validated or {}).get("data_stats")

        def in_a_child() -> dict[str, Any]:
            self.run_command(cfg, "evaluate", staged=self.staged, data_stats=data_stats)
            return evaluate.read_evaluation(cfg)

        evaluation = evaluate.evaluated(cfg, StagedDataset.from_dict(self.staged), registry,
                                        data_stats=data_stats, evaluate_now=in_a_child)
        decision = evaluation["decision"]
        tracking.evaluated(self, cfg, context, evaluation)
        self.log.info("verdict for %s %s: %s%s; %s", cfg.model_name, cfg.run_id,
                      "promote" if decision["promote"] else "keep production",
                      " (forced)" if decision["forced"] else "", "; ".join(decision["reasons"]))
        return {"version": evaluation["version"], "decision": decision,
                "accuracy": evaluation["challenger"]["accuracy"],
                "champion": evaluation["champion"], "run_dir": self.trained["run_dir"]}


class PublishOperator(_ModelStep):
    """The run's model as an immutable version, recording the Airflow run it came from."""

    template_fields = ("evaluation",)
    imports = ("training.steps.publish", "training_airflow.store")
    ui_color = "#d3f9d8"

    def __init__(self, *, evaluation: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.evaluation = evaluation

    def step(self, cfg: Any, registry: Any, context: Any) -> dict[str, Any]:
        from training.steps import publish

        dag_run = context["dag_run"]
        source = {"dag_id": dag_run.dag_id, "run_id": dag_run.run_id}
        result = publish.publish(cfg, registry, created=dag_run.run_after.isoformat(),
                                 source=source, run_dir=self.evaluation["run_dir"])
        tracking.published(self, cfg, context, registry)
        return result


class PromoteOperator(_ModelStep):
    """Moves the production pointer; skipped, with the reasons, when the model lost.
    ``approval``: what ``approve_promotion`` returned (who approved, why); a promotion
    sends an alert (``alerts.py``)."""

    template_fields = ("published", "approval")
    imports = ("training.steps.promote", "training_airflow.store")
    ui_color = "#fff3bf"

    def __init__(self, *, published: Any, approval: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.published, self.approval = published, approval

    def step(self, cfg: Any, registry: Any, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from training.steps import promote
        from training_airflow import alerts
        from training_airflow.approval import request_links

        mark = tracking.missed_mark()
        result = promote.promote(cfg, registry, at=context["dag_run"].run_after.isoformat(),
                                  published=self.published, approval=self.approval)
        tracking.ended(self, cfg, context)
        if not result["promoted"]:
            raise AirflowSkipException("not promoted: " + "; ".join(result["reasons"]))
        name, version = result["model_name"], result["version"]
        dag_run = context["dag_run"]
        tracking.alert_if_missed(mark, name, version, dag_id=dag_run.dag_id,
                                 run_id=dag_run.run_id)
        alerts.send(alerts.promoted(name, version, result["previous"], result["reasons"],
                                    result["by"], request_links(name, version),
                                    dag_id=dag_run.dag_id, run_id=dag_run.run_id))
        for asset in self.outlets:
            context["outlet_events"][asset].extra = {**self.published,
                                                     "forced": result["forced"]}
        return result
