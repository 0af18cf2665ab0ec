"""Tracking: the pipeline's own records mirrored to an MLflow tracking server.

A room, not a thread through the code: the steps, the CLI and the Airflow tasks hand
``Tracker`` what they already produce (the frozen config, each epoch's scalars, the
evaluation, the published version, sweep.json, a move of the production pointer), and
only ``mlflow_tracker.py``, ``mirror.py`` and ``sender.py`` turn that into MLflow
calls. Nothing else imports MLflow, and with no tracking URI (the deployment's
``TRAINING_MLFLOW_TRACKING_URI`` or ``MLFLOW_TRACKING_URI``, empty by default) nothing
imports it at all: ``open_tracker("")`` is ``NO_TRACKING``, whose calls do nothing.

One pipeline run is one MLflow run, whichever process or task writes to it: the run is
found again by its tag ``pipeline.run_id`` (the run's id) in the experiment named after
the model, never by a handle one task keeps. A sweep's trial is a child run of its
sweep's run. Tracking is never a reason for a night to fail: the first call that fails
logs a warning saying why tracking stopped, and the process tracks nothing more (the
registry's mirror is repaired later with ``python -m training models sync-mlflow``).
"""

from __future__ import annotations

import functools
from typing import Any


class NoTracking:
    """Tracking off: every call does nothing (and MLflow is never imported)."""

    enabled = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


NO_TRACKING: Any = NoTracking()


def open_tracker(uri: str) -> Any:
    """The tracker of ``uri`` (a checked tracking URI, ``deployment.tracking_uri``), or
    ``NO_TRACKING`` when it is empty."""
    if not uri:
        return NO_TRACKING
    from training.tracking.mlflow_tracker import MlflowTracker

    return MlflowTracker(uri)


@functools.cache
def tracker_from_env() -> Any:
    """This process's tracker, from the deployment's tracking URI (read once; a
    malformed one is the ConfigError ``tracking_uri_from_env`` raises)."""
    from training.deployment import tracking_uri_from_env

    return open_tracker(tracking_uri_from_env())


def forget_tracker() -> None:
    """Close this process's tracker (its sender process ends after the calls it holds)
    and forget it: the next ``tracker_from_env`` reads the environment again (a test that
    changes the tracking URI)."""
    if tracker_from_env.cache_info().currsize:
        tracker_from_env().close()
    tracker_from_env.cache_clear()


def registry_followers(tracker: Any) -> tuple[Any, ...]:
    """What follows the registry's production pointer (``ModelRegistry(followers=)``):
    the tracker's registry mirror when tracking is on, nothing otherwise."""
    return (tracker,) if tracker.enabled else ()


def tracked_registry(store_uri: str, options: Any = None) -> Any:
    """The model registry on ``store_uri`` with what follows its pointer: the serving
    layout's retention (``TRAINING_SERVING_KEEP``) and this process's MLflow mirror;
    how the CLI, the Airflow tasks and the Models page's promotions open it."""
    from training.deployment import serving_keep_from_env
    from training.registry.versions import open_registry

    return open_registry(store_uri, options, serving_keep=serving_keep_from_env(),
                         followers=registry_followers(tracker_from_env()))
