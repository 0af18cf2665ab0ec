"""``TrainOperator``: run ``python -m training train`` for one DAG run.

``launcher=local`` runs it as a subprocess on the worker, in its own process group:
its output streams line by line into the task log (TensorFlow's CUDA probing noise on
a CPU-only worker left out), ``on_kill`` (a task marked failed, a timeout, a worker
shutdown) sends SIGTERM to its group, and its exit code decides the task: 0 succeeds;
2 is a configuration error that no retry can fix, so the task fails at once without
retries (``AirflowFailException``); anything else fails and is retried. The failure
message is the child's ``error:`` line. The child gets the store's credentials
through its environment only. The run's config is written to
``<output_dir>/<run_id>.launch.json`` and passed with ``--config``; because the run id
comes from the Airflow run, a retry lands in the same run directory and
BackupAndRestore resumes it. The dataset is the one ``stage_dataset`` staged (its XCom,
written beside the config and passed with ``--staged``), verified, never staged again.

``launcher=kubernetes`` runs the run's pods as an Indexed Job through the cncf-kubernetes
provider's ``KubernetesHook`` and follows it to the end
(``training_airflow.kubernetes``); ``on_kill`` deletes the Job.

Other launchers plug in through ``LAUNCHERS``: one function that takes the operator,
the config and the context. A launcher that needs its own clean-up on kill sets
``operator.stop``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from training.errors import LaunchError
from training_airflow.params import aws_conn_id, config_for_run

CONFIG_ERROR_EXIT = 2  # ``python -m training``: a configuration error (training.cli)


def run_child(operator: TrainOperator, command: list[str], env: dict[str, str],
              cwd: str) -> tuple[int, str | None]:
    """Run ``command`` in its own process group, its output into the task log.

    Returns the exit code and the child's last ``error:`` line (None if it printed none).
    """
    from training_airflow.quiet import is_noise

    child = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    operator.child = child
    error = None
    assert child.stdout is not None
    try:
        for raw in child.stdout:
            line = raw.decode(errors="backslashreplace").rstrip()
            if is_noise(line):
                continue
            operator.log.info("%s", line)
            if line.startswith("error: "):
                error = line
    except BaseException:  # a timeout or a kill of the task: the child goes with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        raise
    finally:
        child.stdout.close()
    return child.wait(), error


def _launch_local(operator: TrainOperator, cfg: Any, context: Any) -> dict[str, Any]:
    from airflow.sdk.exceptions import AirflowFailException

    from training_airflow.store import s3_options, subprocess_env

    output_dir = Path(cfg.storage.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config_path = output_dir / f"{cfg.run_id}.launch.json"
    config_path.write_text(cfg.to_json())
    staged_path = output_dir / f"{cfg.run_id}.staged.json"  # stage_dataset's XCom
    staged_path.write_text(json.dumps(operator.staged))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           **subprocess_env(s3_options(cfg.storage.store_uri, aws_conn_id()))}
    command = [sys.executable, "-m", "training", "train", "--config", os.fspath(config_path),
               "--staged", os.fspath(staged_path)]
    operator.log.info("starting the training process (TensorFlow loads for about 15 s "
                      "before the first epoch): %s", " ".join(command))
    code, error = run_child(operator, command, env, os.fspath(output_dir))
    if code == CONFIG_ERROR_EXIT:
        raise AirflowFailException(
            f"training refused its configuration (exit {code}, not retried): "
            f"{error or 'no error line'}")
    if code != 0:
        raise LaunchError(
            f"training exited with code {code}: {error or 'no error line; see the log above'}")
    return {"run_id": cfg.run_id, "run_dir": os.fspath(cfg.run_dir())}


def _launch_kubernetes(operator: TrainOperator, cfg: Any, context: Any) -> dict[str, Any]:
    from training_airflow.launch_kubernetes import launch

    return launch(operator, cfg, context)


LAUNCHERS: dict[str, Callable[[TrainOperator, Any, Any], dict[str, Any]]] = {
    "local": _launch_local,
    "kubernetes": _launch_kubernetes,
}


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
        cfg = config_for_run(context["params"], context["run_id"])
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
