"""The MLflow calls of a pipeline run: found by its tag, params, epochs, the evaluation.

``MlflowTracker`` is what ``open_tracker`` returns when tracking is on. Each call the
pipeline makes is handed to the sender (``sender.py``: a process of its own imports MLflow
and makes the calls in order, and a server that does not answer turns tracking off for
the process) and returns at once; the ``_`` methods here are what the sender process
runs, by name.

A pipeline run's MLflow run is in the experiment named after the model and carries the
tag ``pipeline.run_id``; any process finds it by that tag and creates it when none has
(a sweep's trial: its own run, tagged ``mlflow.parentRunId`` with its sweep's run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.tracking.mirror import RegistryMirror
from training.tracking.params import clean, flat_params
from training.tracking.sender import MlflowSender

RUN_TAG = "pipeline.run_id"
PARENT_TAG = "mlflow.parentRunId"


class MlflowTracker(MlflowSender, RegistryMirror):
    """One tracking server's runs and registry (module doc)."""

    enabled = True

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self._runs: dict[tuple[str, str], str] = {}

    def __repr__(self) -> str:
        return f"MlflowTracker({self.uri!r})"

    # What the pipeline calls: each asks the sender, and returns at once.

    def start(self, cfg: Any, **kwargs: Any) -> None:
        self._later("logging the config", "_start", cfg, **kwargs)

    def set_tags(self, model: str, run_id: str, tags: Mapping[str, Any]) -> None:
        self._later("tagging the run", "_set_tags", model, run_id, dict(tags))

    def log_metrics(self, model: str, run_id: str, values: Mapping[str, Any],
                    step: int = 0) -> None:
        self._later("logging metrics", "_log_metrics", model, run_id, dict(values), step)

    def log_evaluation(self, model: str, run_id: str, evaluation: Mapping[str, Any]) -> None:
        self._later("logging the evaluation", "_log_evaluation", model, run_id, evaluation)

    def log_files(self, model: str, run_id: str, paths: Mapping[str, Path]) -> None:
        self._later("uploading files", "_log_files", model, run_id, dict(paths))

    def end(self, model: str, run_id: str, state: str, reason: str = "", *,
            parent_run_id: str | None = None) -> None:
        self._later("ending the run", "_end", model, run_id, state, reason,
                    parent_run_id=parent_run_id)

    def pointer_moved(self, name: str, pointer: dict[str, Any], store_uri: str) -> None:
        self._later(f"following {name}'s production", "_pointer_moved", name, dict(pointer),
                    store_uri)

    def registered(self, name: str, version: str, store_uri: str,
                   run_id: str | None = None) -> None:
        self._later(f"registering {name} version {version}", "_registered", name, version,
                    store_uri, run_id)

    def sync(self, registry: Any) -> dict[str, Any]:
        """The registry's mirror repaired (``RegistryMirror._sync``), here and now, after
        the calls asked for before (a client of this process's own)."""
        self.flush()
        if self.client is None:
            self._safely("loading MLflow's client", self.connect)
        return self._sync(registry)

    # -- the run

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None  # a tracking server keeps the artifacts where it is told
        if self.uri.startswith("sqlite:///"):  # a local store: beside its database
            database = Path(self.uri.removeprefix("sqlite:///")).resolve()
            location = (database.parent / "artifacts" / name).as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # another task created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _find_or_create(self, model: str, run_id: str, parent: str | None) -> str:
        key = (model, run_id)
        if key in self._runs:
            return self._runs[key]
        experiment = self._experiment(model)
        found = self.client.search_runs(
            [experiment], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'", max_results=1)
        if found:
            mlflow_run = found[0].info.run_id
        else:
            tags = {RUN_TAG: run_id, **({PARENT_TAG: parent} if parent else {})}
            mlflow_run = self.client.create_run(experiment, run_name=run_id,
                                                tags=tags).info.run_id
        self._runs[key] = mlflow_run
        return mlflow_run

    def run_of(self, model: str, run_id: str, *, parent_run_id: str | None = None
               ) -> str | None:
        """The MLflow run id of pipeline run ``run_id`` (created when none has it; a
        trial's under its sweep's run ``parent_run_id``)."""
        def find() -> str:
            parent = (self._find_or_create(model, parent_run_id, None)
                      if parent_run_id else None)
            return self._find_or_create(model, run_id, parent)
        return self._safely("finding the run", find)

    def _start(self, cfg: Any, *, tags: Mapping[str, str] | None = None,
              parent_run_id: str | None = None) -> None:
        """The run's frozen config as params, and ``tags`` (the Airflow DAG and run,
        its link; the backend and strategy), on the pipeline run's MLflow run."""
        from mlflow.entities import Param, RunTag

        mlflow_run = self.run_of(cfg.model_name, cfg.run_id, parent_run_id=parent_run_id)
        if mlflow_run is None:
            return
        params = [Param(k, v) for k, v in flat_params(cfg.to_dict()).items()]
        every = {"backend": str(cfg.runtime.backend),
                 "strategy": str(cfg.runtime.strategy), **(tags or {})}
        run_tags = [RunTag(k, clean(str(v))) for k, v in every.items() if v is not None]

        def log_all() -> None:
            for start in range(0, len(params), 100):  # MLflow takes 100 params a call
                self.client.log_batch(mlflow_run, params=params[start:start + 100])
            self.client.log_batch(mlflow_run, tags=run_tags)
        self._safely("logging the config", log_all)

    def _set_tags(self, model: str, run_id: str, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        mlflow_run = self.run_of(model, run_id)
        if mlflow_run is not None:
            self._safely("tagging the run", lambda: self.client.log_batch(
                mlflow_run, tags=[RunTag(k, clean(str(v))) for k, v in tags.items()]))

    def _log_metrics(self, model: str, run_id: str, values: Mapping[str, Any],
                    step: int = 0) -> None:
        """Numeric ``values`` at ``step`` (an epoch counted from 0)."""
        from mlflow.entities import Metric

        mlflow_run = self.run_of(model, run_id)
        if mlflow_run is None:
            return
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if metrics:
            self._safely("logging metrics", lambda: self.client.log_batch(
                mlflow_run, metrics=metrics))

    def _log_evaluation(self, model: str, run_id: str, evaluation: Mapping[str, Any]) -> None:
        """The test metrics of the challenger and the champion, and the decision."""
        champion = evaluation.get("champion") or {}
        values = {f"test_{k}": v for k, v in (evaluation.get("challenger") or {}).items()}
        values.update({f"champion_test_{k}": v for k, v in champion.items()})
        self._log_metrics(model, run_id, values)
        decision = evaluation.get("decision") or {}
        self._set_tags(model, run_id, {
            "decision.promote": decision.get("promote"),
            "decision.reasons": "; ".join(decision.get("reasons") or ()),
            **({"champion.version": champion["version"]} if champion.get("version") else {})})

    def _log_files(self, model: str, run_id: str, paths: Mapping[str, Path]) -> None:
        """Artifacts: ``{folder in the run: local file or directory}`` (the report,
        sweep.json), each that exists."""
        mlflow_run = self.run_of(model, run_id)
        if mlflow_run is None:
            return
        for folder, path in paths.items():
            if path.is_dir():
                self._safely(f"uploading {folder}", lambda p=path, f=folder:
                             self.client.log_artifacts(mlflow_run, os.fspath(p), f))
            elif path.is_file():
                self._safely(f"uploading {folder}", lambda p=path, f=folder:
                             self.client.log_artifact(mlflow_run, os.fspath(p), f or None))

    def _end(self, model: str, run_id: str, state: str, reason: str = "", *,
            parent_run_id: str | None = None) -> None:
        """The run's end: ``state`` is ``complete`` or ``skipped`` (a night with nothing
        new: FINISHED), ``pruned`` (KILLED) or ``failed`` (FAILED), with ``reason`` as a
        tag (a trial's: under ``parent_run_id``)."""
        status = {"complete": "FINISHED", "skipped": "FINISHED",
                  "pruned": "KILLED"}.get(state, "FAILED")
        mlflow_run = self.run_of(model, run_id, parent_run_id=parent_run_id)
        if mlflow_run is None:
            return
        self._set_tags(model, run_id, {"pipeline.state": state,
                                      **({"pipeline.reason": reason} if reason else {})})
        self._safely("ending the run", lambda: self.client.set_terminated(mlflow_run, status))
