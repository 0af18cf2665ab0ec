"""A training run on Kubernetes: a ConfigMap, a headless Service, an Indexed Job.

One idea per module:

- ``names``: Kubernetes' name rules and the names of a run's objects (``job_name``);
- ``options``: ``KubernetesOptions``, everything the RunConfig does not say (namespace,
  image, identity, scheduling, shared volume, how the launch follows the Job), validated
  when built, read from JSON or the ``TRAINING_K8S_*`` variables;
- ``manifests``: ``render(cfg, options)``, the three objects as plain dicts, and ``to_yaml``;
- ``kueue``: queueing on a shared cluster (the queue label, the suspended Job) and
  ``QueueWatch``, the follower's view of a Job waiting to be admitted;
- ``pod``: inside each pod, ``TF_CONFIG`` from the Job's completion index (the
  ``exec`` wrapper every pod runs);
- ``job``: ``TrainingJob``, which applies the objects with plain ``kubernetes`` API
  clients, follows the Job, copies its pods' logs, explains a failure and stops it;
- ``follow``: one look at a Job (state, queue, new lines, progress), paced by the task
  (``TrainingJob``) or by a deferred task's trigger;
- ``logs``: reading the pods' logs once each, and the failed pods' story;
- ``cli``: ``python -m training.launch.kubernetes exec|tf-config|render``.

Nothing here imports TensorFlow, Airflow or (at import time) the ``kubernetes`` client.
The package re-exports the public names below. (The rendering module is ``manifests``,
not ``render``: a module named like the function it exports would be hidden by it.)
"""

from training.launch.kubernetes.cli import main
from training.launch.kubernetes.job import TrainingJob
from training.launch.kubernetes.manifests import render, to_yaml
from training.launch.kubernetes.names import job_name, run_id_label
from training.launch.kubernetes.options import KubernetesOptions
from training.launch.kubernetes.pod import tf_config_for_index, tf_config_from_env, worker_hosts

__all__ = ["KubernetesOptions", "TrainingJob", "job_name", "main", "render", "run_id_label",
           "tf_config_for_index", "tf_config_from_env", "to_yaml", "worker_hosts"]
