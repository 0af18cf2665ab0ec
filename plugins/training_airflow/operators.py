"""``TrainOperator``: run ``python -m training train`` for one DAG run.

``launcher=local`` runs it as a subprocess on the worker through the standard
provider's ``SubprocessHook``: its output streams line by line into the task log,
``on_kill`` (a task marked failed, a timeout, a worker shutdown) sends SIGTERM to its
process group, and its exit code decides the task. The child gets the store's
credentials through its environment only. The run's config is written to
``<output_dir>/<run_id>.launch.json`` and passed with ``--config``; because the run id
comes from the Airflow run, a retry lands in the same run directory and
BackupAndRestore resumes it.

``launcher=kubernetes`` runs the run's pods as an Indexed Job through the cncf-kubernetes
provider's ``KubernetesHook`` and follows it to the end
(``training_airflow.kubernetes``); ``on_kill`` deletes the Job.

Other launchers plug in through ``LAUNCHERS``: one function that takes the operator,
the config and the context. A launcher that needs its own clean-up on kill sets
``operator.stop``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from training.errors import TrainingError
from training_airflow.params import aws_conn_id, config_for_run


class TrainingLaunchError(TrainingError, RuntimeError):
    """Training ended without a model (non-zero exit, a failed Job, an unusable launcher)."""


def _launch_local(operator: TrainOperator, cfg: Any, context: Any) -> dict[str, Any]:
    from airflow.providers.standard.hooks.subprocess import SubprocessHook

    from training_airflow.store import s3_options, subprocess_env

    output_dir = Path(cfg.storage.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config_path = output_dir / f"{cfg.run_id}.launch.json"
    config_path.write_text(cfg.to_json())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           **subprocess_env(s3_options(cfg.storage.store_uri, aws_conn_id()))}
    command = [sys.executable, "-m", "training", "train", "--config", os.fspath(config_path)]
    operator.hook = SubprocessHook()
    result = operator.hook.run_command(command=command, env=env, cwd=os.fspath(output_dir))
    if result.exit_code != 0:
        raise TrainingLaunchError(
            f"training exited with code {result.exit_code}: {result.output}"
        )
    return {"run_id": cfg.run_id, "run_dir": os.fspath(cfg.run_dir())}


def _launch_kubernetes(operator: TrainOperator, cfg: Any, context: Any) -> dict[str, Any]:
    from training_airflow.kubernetes import launch

    return launch(operator, cfg, context)


LAUNCHERS: dict[str, Callable[[TrainOperator, Any, Any], dict[str, Any]]] = {
    "local": _launch_local,
    "kubernetes": _launch_kubernetes,
}


class TrainOperator(BaseOperator):
    """Train the run's model with the launcher its params ask for; XCom: the run dir."""

    ui_color = "#ffd8a8"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hook: Any = None
        self.stop: Callable[[], None] | None = None  # set by launchers with their own kill

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = config_for_run(context["params"], context["run_id"])
        launch = LAUNCHERS[cfg.runtime.launcher]
        self.log.info("launching %s training for run %s (%s, %d worker(s))",
                      cfg.runtime.launcher, cfg.run_id, cfg.runtime.accelerator,
                      cfg.runtime.workers)
        return launch(self, cfg, context)

    def on_kill(self) -> None:
        if self.stop is not None:
            self.stop()
        elif self.hook is not None:
            self.hook.send_sigterm()
