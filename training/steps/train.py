"""Step 3, train: the model fitted on the staged dataset, by the process the run needs.

- several workers on this host (``runtime.workers`` > 1 and no cluster in
  ``TF_CONFIG``): ``training.launch.local`` starts and supervises them;
- one worker of a cluster (a pod of the Kubernetes Job, or a local launcher's worker):
  ``training.launch.worker`` trains and reports its final weights' digest;
- otherwise this process: ``training.train.fit``; or, when this process's Keras backend
  is not the run's (``python -m training run`` stages in TensorFlow's process), a child
  process of the run's backend (``python -m training train``).

(On Airflow the ``train`` task runs this in a child process, ``Step.run_command`` in
``plugins/training_airflow/tasks.py``, or in a Job, ``launchers.py``.) Already done for this run?
``training.train.fit.already_trained``: a run whose ``trained.json`` is written is
never trained again, and one trained with other settings is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from training import backend
from training.config import RunConfig
from training.data.snapshot.staging import StagedDataset
from training.errors import ConfigError, WorkersFailed
from training.train import cluster


def train(cfg: RunConfig, staged: StagedDataset, *, extra_callbacks: Sequence[Any] = (),
          tracking_callbacks: Callable[[], Sequence[Any]] = tuple) -> dict[str, Any]:
    """Train ``cfg`` on ``staged``; returns what training reported (``TrainResult``'s
    dict). Raises ``WorkersFailed`` with the launcher's exit status when a worker of a
    local multi-worker run fails. ``extra_callbacks`` (a sweep trial's pruning) join
    ``fit`` in this process; a run trained elsewhere is refused them.
    ``tracking_callbacks`` makes the callbacks that log each epoch to MLflow (the
    chief's: ``run_extras``), called only where ``fit`` runs in this process, a pod's or
    a worker's included: a run trained by other processes (the local launcher's workers,
    a child of the other backend) never builds them (nor imports Keras for them), since
    the process that trains makes its own."""
    if extra_callbacks and (cfg.runtime.workers > 1 or cluster.current()
                            or cfg.runtime.backend != backend.chosen()):
        raise ConfigError("a sweep trial's pruning callback runs only where the trial "
                          "trains in this process: one worker, this process's backend")
    if cfg.runtime.workers > 1 and not cluster.current():
        from training.launch import local  # N worker processes on this host

        result = local.run(cfg, staged=staged)
        if result.returncode:
            raise WorkersFailed(result.reason, result.returncode)
        return result.trained
    if cluster.current():
        from training.launch.worker import train_reporting

        return train_reporting(cfg, staged, callbacks=tracking_callbacks()).to_dict()
    if cfg.runtime.backend != backend.chosen():
        return _in_child(cfg, staged)  # `run` in TensorFlow's process, asked for jax
    from training.train.fit import train as fit

    return fit(cfg, staged, extra_callbacks=[*extra_callbacks, *tracking_callbacks()]).to_dict()


def _in_child(cfg: RunConfig, staged: StagedDataset) -> dict[str, Any]:
    """Train in a child process of the run's backend (``python -m training train``),
    under this process's claim of the run; what it reported. SIGTERM and SIGINT to this
    process are passed on to the child, which stops the way ``train`` stops (a backup,
    exit 143), and the ``LaunchError`` raised then carries its exit status. Its config
    goes in a ``train-*`` directory of the temp dir that one killed by SIGKILL leaves
    and the next such launch removes (``processes.scratch_dir``)."""
    import sys

    from training.launch import processes
    from training.launch.command import TrainingCommand
    from training.locks import claimed_env

    with processes.scratch_dir("train-") as tmp:
        command = TrainingCommand("train", cfg.write(tmp), output_dir=tmp, run_id=cfg.run_id,
                                  staged=staged.to_dict(), env=claimed_env(),
                                  forward_signals=True)
        results = command.run(lambda line: print(line, file=sys.stderr, flush=True))
    return results["trained"]
