"""``Step``: what every step of the DAG does around its work, and the config hand-over.

No step imports TensorFlow or tensorflow-datasets in the Airflow task process: what
needs them runs as ``python -m training ...`` in a child process (``Step.run_command``:
``training.launch.command.TrainingCommand`` with the connection's credentials in its
environment; exit 2, a configuration no retry can fix, fails the task without
retries), so a task costs its process start and its work, not a 10-16 s import. ``Step``
is what every step does around its work: its imports (timed), this worker's deployment
(``training.deployment``), the run's config, a timing line first and last, and a record
of what it did in the run directory (``records.py``, read back by ``tools/summary.py``).

The run's config is built and checked once, by the run's first step (``builds_config``:
``stage_dataset``, from the params and the deployment, ``params.config_for``), frozen
into the run directory (``training.config.frozen``) and handed on through XCom (key
``config``: its path and SHA-256). Every later step thaws that file, so no step
re-derives a run setting (what to train, where its data and store are) from its own
worker's environment, and a file changed since the first step wrote it fails the task
without retries. A step that ``hands_config`` (``train`` after a sweep: the picked
trial's) hands the steps after it a config of its own the same way. What belongs to the
worker stays the worker's: the connection holding the store's credentials, the
Kubernetes options, the queues. A run started before this hand-over existed has no
``config`` XCom: its later tasks fail saying so, and clearing the run from its first
task starts it again on a frozen config. The operators: ``tasks.py``, ``sweep_tasks.py``.

A step that waits on work outside Airflow may defer (``TRAINING_DEFERRABLE``, read as
every step starts: a word that is not a boolean fails it without retries). It comes
back in ``resume``, which runs the step again with ``self.event`` the trigger's event
(the launch it deferred from takes it up), and records it once it ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from training.deployment import Deployment
from training_airflow.params import config_for, run_id_for

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
    deferrable = False  # TRAINING_DEFERRABLE, read as the step starts (read_deferrable)
    event: Any = None  # the trigger's event, when the task resumed from a deferral
    entered_at = 0.0  # epoch second this execution of the step started
    deployment: Deployment  # this worker's (training.deployment), read as the step starts
    frozen: dict[str, str]  # the run's frozen config file: {"path", "sha256"}

    def run_command(self, cfg: Any, command: str, *, staged: Any = None,
                    data_stats: Any = None, flags: tuple[str, ...] = (),
                    config: str | None = None) -> dict[str, Any]:
        """``python -m training COMMAND`` for this run as the task's child, on the run's
        frozen config (or ``config``: a sweep trial's), the connection's credentials in
        its environment, its lines in the task log, in the task's working directory (a
        relative ``data_uri`` means there what it means here); what it printed as JSON.
        Exit 2 fails the task without retries."""
        from airflow.sdk.exceptions import AirflowFailException

        from training.errors import ConfigError
        from training.launch.command import TrainingCommand
        from training_airflow.store import child_env

        self.launch = TrainingCommand(
            command, config or self.frozen["path"], output_dir=cfg.storage.output_dir,
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
        return self._step(context)

    def defer(self, **kwargs: Any) -> None:
        """``BaseOperator.defer``, after a warning in the task log when no triggerer
        runs (``triggerer_health.py``: Airflow would let the task wait in silence)."""
        from training_airflow.triggerer_health import say_if_no_triggerer

        say_if_no_triggerer(self.log)
        super().defer(**kwargs)

    def resume(self, context: Any, event: Any = None) -> Any:
        """The task back from its trigger (``defer(method_name="resume")``): the step
        again, ``self.event`` the trigger's event, which the launch it deferred from
        takes up (``launchers.py``, ``sweep_tasks.py``)."""
        self.event = event
        return self._step(context)

    def _step(self, context: Any) -> Any:
        import importlib
        import time
        from datetime import UTC, datetime

        from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred

        from training_airflow import records

        entered = datetime.now(UTC)
        self.entered_at = time.time()
        began = time.perf_counter()
        for module in self.imports:
            importlib.import_module(module)
        imported = time.perf_counter() - began
        self.deployment = self.read_deployment()
        self.deferrable = self.read_deferrable()
        cfg = self.run_config(context)
        ti, dag_run = context.get("ti"), context.get("dag_run")
        if ti is None or dag_run is None or not self.has_dag():
            return self.work(cfg, context)  # called outside a DAG run: nothing to record
        # The DAG run's own run directory, also for the steps on a sweep's picked trial.
        run_dir = Path(cfg.storage.output_dir) / run_id_for(dag_run.run_id)
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
        except TaskDeferred:  # handed to the triggerer: the record waits for the end
            self.log.info("deferred: the wait goes on in the triggerer, holding no worker "
                          "slot; the task resumes when it ends")
            raise
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

    @staticmethod
    def read_deferrable() -> bool:
        """``TRAINING_DEFERRABLE`` (default true): whether a wait outside Airflow (a
        Kubernetes Job, a sweep's lane) is handed to the triggerer. Read by every step,
        so a word that is not a boolean fails the run's first task, without retries."""
        from airflow.sdk.exceptions import AirflowFailException

        from training.deployment import deferrable_from_env
        from training.errors import ConfigError

        try:
            return deferrable_from_env()
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
        # A sweep's pick (``train``) hands on its trial's config to the steps after it.
        handed = next(filter(None, (context["ti"].xcom_pull(task_ids=t, key=CONFIG_XCOM)
                                    for t in self._config_sources(first.task_id))), None)
        if not handed:
            raise AirflowFailException(f"{first.task_id} handed on no frozen config (XCom "
                                       f"{CONFIG_XCOM!r}): run the run again from it")
        try:
            cfg = frozen.thaw(handed)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.frozen = dict(handed)
        return cfg

    def _config_sources(self, first: str) -> list[str]:
        upstream = self.get_flat_relative_ids(upstream=True)
        return [*(t.task_id for t in self.dag.tasks if t.task_id in upstream
                  and getattr(t, "hands_config", False)), first]

    def work(self, cfg: Any, context: Any) -> Any:
        raise NotImplementedError


def _steps_graph(dag: Any) -> dict[str, list[str]]:
    """Each step's downstream steps, through the tasks that are not steps (the approval:
    Airflow's own operator, which keeps no record), as the run's records show them."""
    def is_step(task: Any) -> bool:  # a mapped task's operator is its operator_class
        kind = getattr(task, "operator_class", None)
        return isinstance(task, Step) or (isinstance(kind, type) and issubclass(kind, Step))

    steps = {t.task_id for t in dag.tasks if is_step(t)}

    def below(task_id: str) -> set[str]:
        found: set[str] = set()
        for down in dag.get_task(task_id).downstream_task_ids:
            found |= {down} if down in steps else below(down)
        return found

    return {step: sorted(below(step)) for step in steps}
