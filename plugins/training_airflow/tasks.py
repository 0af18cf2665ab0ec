"""The DAG's steps: one operator each, one library call each.

No step imports TensorFlow or tensorflow-datasets in the Airflow task process: what
needs them runs as ``python -m training ...`` in a child process (``Step.run_command``:
``training.launch.command.TrainingCommand`` with the connection's credentials in its
environment; exit 2, a configuration no retry can fix, fails the task without
retries), so a task costs its process start and its work, not a 10-16 s import. ``Step`` is what
every step does around its work: its imports (timed), this worker's deployment
(``training.deployment``), the run's config, a timing line first and last, and a record
of what it did in the run directory (``records.py``, read back by ``tools/summary.py``).

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

Every step takes what the step before produced from its XCom (template fields holding
``XComArg``s, which also wire the dependencies). The run's config is built and checked
once, by the run's first step (``builds_config``: ``stage_dataset``, from the params and
the deployment, ``params.config_for``), frozen into the run directory
(``training.config.frozen``) and handed on through XCom (key ``config``: its path and
SHA-256). Every later step thaws that file, so no step re-derives a run setting (what
to train, where its data and store are) from its own worker's environment, and a file
changed since the first step wrote it fails the task without retries. What belongs to
the worker stays the worker's: the connection holding the store's credentials, the
Kubernetes options, the queues. A run started before this hand-over existed has no
``config`` XCom: its later tasks fail saying so, and clearing the run from its first
task starts it again on a frozen config.

Over 300 lines on purpose: the base step and the six operators are one idea, the DAG's
steps, and a reader follows a trigger from the form to the launcher in one file. The
model steps carry the "Model version" extra link (``links.py``).
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import BaseOperator

from training.deployment import Deployment
from training_airflow.links import VERSION_XCOM, ModelVersionLink
from training_airflow.params import config_for

SKIP_XCOM = "skipped_because"  # validate_data: why the run did not train
CONFIG_XCOM = "config"  # the first step's frozen config: {"path", "sha256"}


class Step(BaseOperator):
    """One step of the DAG: its library modules imported and timed, the run's config,
    a timing line first and last in the log, and a record of what it did in the run
    directory (``records.py``). Subclasses say what the step needs (``imports``) and
    does (``work``). No step imports TensorFlow or tfds: what needs them runs in a
    child process (``run_command``)."""

    imports: tuple[str, ...] = ()
    builds_config = False  # the run's first step: builds, checks and freezes the config
    launch: Any = None  # what the step started (training.launch: run, then stop on kill)
    deployment: Deployment  # this worker's (training.deployment), read as the step starts
    frozen: dict[str, str]  # the run's frozen config file: {"path", "sha256"}

    def run_command(self, cfg: Any, command: str, *, staged: Any = None,
                    data_stats: Any = None, flags: tuple[str, ...] = ()) -> dict[str, Any]:
        """``python -m training COMMAND`` for this run as the task's child, on the run's
        frozen config, the connection's credentials in its environment, its lines in
        the task log, in the task's working directory (a relative ``data_uri`` means
        there what it means here); what it printed as JSON. Exit 2 fails the task
        without retries."""
        from airflow.sdk.exceptions import AirflowFailException

        from training.errors import ConfigError
        from training.launch.command import TrainingCommand
        from training_airflow.store import child_env

        self.launch = TrainingCommand(
            command, self.frozen["path"], output_dir=cfg.storage.output_dir,
            run_id=cfg.run_id, staged=staged, data_stats=data_stats, flags=flags,
            env=child_env(cfg, self.deployment.aws_conn_id), cwd=os.getcwd())
        self.log.info("starting %s (TensorFlow loads in it, about 15 s): %s", command,
                      " ".join(self.launch.argv()))
        try:
            return self.launch.run(lambda line: self.log.info("%s", line))
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from exc

    def on_kill(self) -> None:
        if self.launch is not None:
            self.log.info("stopping %s", type(self.launch).__name__)
            self.launch.stop()

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
        self.deployment = self.read_deployment()
        cfg = self.run_config(context)
        ti, dag_run, run_dir = context.get("ti"), context.get("dag_run"), cfg.run_dir()
        if ti is None or dag_run is None or not self.has_dag():
            return self.work(cfg, context)  # called outside a DAG run: nothing to record
        timed = records.timing(run_dir, ti, dag_run, self.upstream_task_ids, entered,
                               imported)
        self.log.info("%s", timed.line())
        graph = _steps_graph(self.dag)

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

    @staticmethod
    def read_deployment() -> Deployment:
        """This worker's deployment; a wrong setting fails the task without retries."""
        from airflow.sdk.exceptions import AirflowFailException

        from training.errors import ConfigError

        try:
            return Deployment.from_env()
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from exc

    def run_config(self, context: Any) -> Any:
        """The run's config: built from the params and frozen by the run's first step
        (or by a step called outside a DAG run), thawed from its file by every later
        one. A frozen file that is gone or changed fails the task without retries."""
        from airflow.sdk.exceptions import AirflowFailException

        from training.config import frozen
        from training.errors import ConfigError

        first = next((t for t in self.dag.tasks if getattr(t, "builds_config", False)),
                     None) if self.has_dag() and context.get("ti") is not None else None
        if first is None or first.task_id == self.task_id:  # (the task runs a copy)
            cfg = config_for(context, self.deployment)
            self.frozen = frozen.freeze(cfg)
            if first is not None:
                context["ti"].xcom_push(key=CONFIG_XCOM, value=self.frozen)
            return cfg
        handed = context["ti"].xcom_pull(task_ids=first.task_id, key=CONFIG_XCOM)
        if not handed:
            raise AirflowFailException(f"{first.task_id} handed on no frozen config (XCom "
                                       f"{CONFIG_XCOM!r}): run the run again from it")
        try:
            cfg = frozen.thaw(handed)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.frozen = dict(handed)
        return cfg

    def work(self, cfg: Any, context: Any) -> Any:
        raise NotImplementedError


def _steps_graph(dag: Any) -> dict[str, list[str]]:
    """Each step's downstream steps, through the tasks that are not steps (the approval:
    Airflow's own operator, which keeps no record), as the run's records show them."""
    steps = {t.task_id for t in dag.tasks if isinstance(t, Step)}

    def below(task_id: str) -> set[str]:
        found: set[str] = set()
        for down in dag.get_task(task_id).downstream_task_ids:
            found |= {down} if down in steps else below(down)
        return found

    return {step: sorted(below(step)) for step in steps}


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
        return result


class TrainOperator(Step):
    """Train the run's model on the staged dataset (``stage_dataset``'s XCom) with the
    launcher its params ask for; XCom: the run dir. ``launcher=local`` also evaluates
    in the same child process (``validate_data``'s statistics handed over), so
    TensorFlow loads once per run."""

    template_fields = ("staged", "validated")
    imports = ("training.launch.command", "training_airflow.store")
    ui_color = "#ffd8a8"

    def __init__(self, *, staged: Any, validated: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staged, self.validated = staged, validated

    def work(self, cfg: Any, context: Any) -> dict[str, Any]:
        self.log.info("launching %s training for run %s (%s, %d worker(s))",
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

        from training.data.staging import StagedDataset
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
        from training.data.staging import StagedDataset
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
        return publish.publish(cfg, registry, created=dag_run.run_after.isoformat(),
                                source=source, run_dir=self.evaluation["run_dir"])


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

        result = promote.promote(cfg, registry, at=context["dag_run"].run_after.isoformat(),
                                  published=self.published, approval=self.approval)
        if not result["promoted"]:
            raise AirflowSkipException("not promoted: " + "; ".join(result["reasons"]))
        name, version = result["model_name"], result["version"]
        dag_run = context["dag_run"]
        alerts.send(alerts.promoted(name, version, result["previous"], result["reasons"],
                                    result["by"], request_links(name, version),
                                    dag_id=dag_run.dag_id, run_id=dag_run.run_id))
        for asset in self.outlets:
            context["outlet_events"][asset].extra = {**self.published,
                                                     "forced": result["forced"]}
        return result
