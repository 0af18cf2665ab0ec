"""Launchers: where a validated ``RunConfig`` trains.

* local subprocess: ``python -m training train --config FILE`` on the Airflow worker,
  a child of the task (``child.py``: started, its output streamed, stopped);
* local multi-worker (``local.py``, the supervisor): ``runtime.workers`` processes of
  ``python -m training.launch.worker`` (``worker.py``; ``processes.py`` starts, watches
  and stops them) on one machine, each with its own ``TF_CONFIG``;
* Kubernetes (``training.launch.kubernetes``): a ConfigMap, a headless Service and an
  Indexed Job of ``runtime.workers`` pods, on CPU, GPU or GKE TPU nodes.

Every launcher trains on the same validated config; none imports TensorFlow.
"""
