"""Launchers: where a validated ``RunConfig`` trains, each behind one interface: ``run``
to its end (raising ``LaunchError``, or ``ConfigError`` for a configuration no retry can
fix), ``stop`` from another thread (a task killed, timed out, its worker shut down).

* a step as a child process (``command.py``: ``TrainingCommand``, ``python -m training
  COMMAND --config <frozen config>`` on the Airflow worker; ``child.py`` starts it in
  its own process group, streams its output, stops it);
* local multi-worker (``local.py``, the supervisor): ``runtime.workers`` processes of
  ``python -m training.launch.worker`` (``worker.py``; ``processes.py`` starts, watches
  and stops them) on one machine, each with its own ``TF_CONFIG``;
* Kubernetes (``training.launch.kubernetes``: ``TrainingJob``): a ConfigMap, a headless
  Service and an Indexed Job of ``runtime.workers`` pods, on CPU, GPU or GKE TPU nodes.

Every launcher trains on the same validated config; none imports TensorFlow or
Airflow. The Airflow tasks use them through ``Step.run_command`` (``tasks.py``) and
``launchers.py`` in ``plugins/training_airflow/``, which only add the connections'
credentials and clients.
"""
