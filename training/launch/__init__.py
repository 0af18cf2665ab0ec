"""Launchers: where a validated ``RunConfig`` trains.

* local subprocess: ``python -m training train --config FILE`` on the Airflow worker;
* local multi-worker (``training.launch.local``): ``runtime.workers`` processes on one
  machine, each with its own ``TF_CONFIG``;
* Kubernetes (``training.launch.kubernetes``): a ConfigMap, a headless Service and an
  Indexed Job of ``runtime.workers`` pods, on CPU, GPU or GKE TPU nodes.

Every launcher runs the same CLI with the same config; none imports TensorFlow.
"""
