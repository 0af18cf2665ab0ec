"""Step 3, train: the model fitted on the staged dataset, by the process the run needs.

- several workers on this host (``runtime.workers`` > 1 and no cluster in
  ``TF_CONFIG``): ``training.launch.local`` starts and supervises them;
- one worker of a cluster (a pod of the Kubernetes Job, or a local launcher's worker):
  ``training.launch.worker`` trains and reports its final weights' digest;
- otherwise this process: ``training.train.fit``.

(On Airflow the ``train`` task runs this in a child process, ``Step.run_command`` in
``plugins/training_airflow/tasks.py``, or in a Job, ``launchers.py``.) Already done for this run?
``training.train.fit.already_trained``: a run whose ``trained.json`` is written is
never trained again, and one trained with other settings is refused.
"""

from __future__ import annotations

from typing import Any

from training.config import RunConfig
from training.data.staging import StagedDataset
from training.errors import WorkersFailed
from training.train import cluster


def train(cfg: RunConfig, staged: StagedDataset) -> dict[str, Any]:
    """Train ``cfg`` on ``staged``; returns what training reported (``TrainResult``'s
    dict). Raises ``WorkersFailed`` with the launcher's exit status when a worker of a
    local multi-worker run fails."""
    if cfg.runtime.workers > 1 and not cluster.current():
        from training.launch import local  # N worker processes on this host

        result = local.run(cfg, staged=staged)
        if result.returncode:
            raise WorkersFailed(result.reason, result.returncode)
        return result.trained
    if cluster.current():
        from training.launch.worker import train_reporting

        return train_reporting(cfg, staged).to_dict()
    from training.train.fit import train as fit

    return fit(cfg, staged).to_dict()
