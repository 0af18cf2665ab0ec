"""The MLflow calls of a pipeline run: found by its tag, params, epochs, the evaluation.

``MlflowTracker`` is what ``open_tracker`` returns when tracking is on. Every call goes
through ``_safely``: a server that does not answer logs one warning naming what failed
and why, and the tracker is off for the rest of the process, so a night never waits on
or fails for MLflow; a call the server refuses (say, a model version whose source is a
local path, which a remote server does not take) is a warning for that call alone. The
client retries an HTTP call once and waits at most ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (10 s
here unless set).

MLflow is imported, and every call made, by one sender thread, in the order asked for:
importing MLflow takes seconds, and the training process, a trial's task or a promotion
never waits for it or for the server; ``flush`` (at the end of a task, and at exit)
waits until the calls asked for are made.

A pipeline run's MLflow run is in the experiment named after the model and carries the
tag ``pipeline.run_id``; any process finds it by that tag and creates it when none has
(a sweep's trial: its own run, tagged ``mlflow.parentRunId`` with its sweep's run).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from training.tracking.mirror import RegistryMirror
from training.tracking.params import clean, flat_params

log = logging.getLogger("training")

RUN_TAG = "pipeline.run_id"
PARENT_TAG = "mlflow.parentRunId"


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be reached (MLflow wraps requests'
    connection errors in an MlflowException that names them)."""
    text = f"{type(exc).__name__}: {exc}"
    return isinstance(exc, (OSError, TimeoutError)) or any(
        mark in text for mark in ("Max retries exceeded", "Connection refused",
                                  "ConnectionError", "timed out", "Read timed out",
                                  "NewConnectionError", "RemoteDisconnected"))


class MlflowTracker(RegistryMirror):
    """One tracking server's runs and registry (module doc)."""

    enabled = True

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client: Any = None
        self.stopped: str | None = None
        self._runs: dict[tuple[str, str], str] = {}
        self._calls: queue.Queue[Callable[[], Any]] = queue.Queue()
        self._ready = threading.Event()
        self._sender: threading.Thread | None = None
        self._starting = threading.Lock()
        atexit.register(self.flush)

    def __repr__(self) -> str:
        return f"MlflowTracker({self.uri!r})"

    # -- the sender: MLflow imported and called off the caller's thread

    def _send(self) -> None:
        """Import MLflow (seconds: never on a training step's path), then make the
        calls in the order they were asked for."""
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")

        def connect() -> None:
            import mlflow

            self.client = mlflow.MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        self._safely("loading MLflow's client", connect)
        self._ready.set()
        while True:
            call = self._calls.get()
            try:
                call()
            finally:
                self._calls.task_done()

    def warm(self) -> None:
        """Start loading MLflow now, in the sender (a process that will track soon: a
        trial's task while its trial trains). A process that asks for nothing (a
        validation, ``models list``) never loads it."""
        with self._starting:
            if self._sender is None:
                self._sender = threading.Thread(target=self._send, name="mlflow-tracking",
                                                daemon=True)
                self._sender.start()

    def _later(self, what: str, call: Callable[[], Any]) -> None:
        if not self.stopped:
            self.warm()
            self._calls.put(lambda: self._safely(what, call))

    def flush(self, timeout_s: float = 120.0) -> bool:
        """Wait until every call asked for so far was made (or tracking stopped), at
        most ``timeout_s``; whether it was. A process calls it before it exits (also at
        exit); a task, before it ends."""
        deadline = time.monotonic() + timeout_s
        while self._calls.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._calls.unfinished_tasks:
            log.warning("warning: MLflow tracking: %d calls not made in %.0f s (%s); the "
                        "run goes on without them", self._calls.unfinished_tasks, timeout_s,
                        self.uri)
            return False
        return True

    # What the pipeline calls: each asks the sender, and returns at once.

    def start(self, cfg: Any, **kwargs: Any) -> None:
        self._later("logging the config", lambda: self._start(cfg, **kwargs))

    def set_tags(self, model: str, run_id: str, tags: Mapping[str, Any]) -> None:
        self._later("tagging the run", lambda: self._set_tags(model, run_id, tags))

    def log_metrics(self, model: str, run_id: str, values: Mapping[str, Any],
                    step: int = 0) -> None:
        self._later("logging metrics", lambda: self._log_metrics(model, run_id, dict(values),
                                                                 step))

    def log_evaluation(self, model: str, run_id: str, evaluation: Mapping[str, Any]) -> None:
        self._later("logging the evaluation",
                    lambda: self._log_evaluation(model, run_id, evaluation))

    def log_files(self, model: str, run_id: str, paths: Mapping[str, Path]) -> None:
        self._later("uploading files", lambda: self._log_files(model, run_id, paths))

    def end(self, model: str, run_id: str, state: str, reason: str = "", *,
            parent_run_id: str | None = None) -> None:
        self._later("ending the run", lambda: self._end(
            model, run_id, state, reason, parent_run_id=parent_run_id))

    def pointer_moved(self, name: str, pointer: dict[str, Any], store_uri: str) -> None:
        self._later(f"following {name}'s production",
                    lambda: self._pointer_moved(name, dict(pointer), store_uri))

    def registered(self, name: str, version: str, store_uri: str,
                   run_id: str | None = None) -> None:
        self._later(f"registering {name} version {version}",
                    lambda: self._registered(name, version, store_uri, run_id))

    def sync(self, registry: Any) -> dict[str, Any]:
        """The registry's mirror repaired (``RegistryMirror._sync``), here and now."""
        self.warm()
        self.flush()
        self._ready.wait()
        return self._sync(registry)

    def _safely(self, what: str, call: Callable[[], Any]) -> Any:
        if self.stopped:
            return None
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - tracking never fails a night
            reason = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            if not _unreachable(exc):  # the server answered: this call alone is refused
                log.warning("warning: MLflow refused %s (%s); tracking goes on", what, reason)
                return None
            self.stopped = reason
            log.warning("warning: MLflow tracking stopped for this process (%s at %s); the "
                        "run goes on, and `python -m training models sync-mlflow` repairs "
                        "the registry's mirror later", self.stopped, self.uri)
            return None

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
        """The run's end: ``state`` is ``complete`` (FINISHED), ``pruned`` (KILLED) or
        ``failed`` (FAILED), with ``reason`` as a tag (a trial's: under
        ``parent_run_id``)."""
        status = {"complete": "FINISHED", "pruned": "KILLED"}.get(state, "FAILED")
        mlflow_run = self.run_of(model, run_id, parent_run_id=parent_run_id)
        if mlflow_run is None:
            return
        self._set_tags(model, run_id, {"pipeline.state": state,
                                      **({"pipeline.reason": reason} if reason else {})})
        self._safely("ending the run", lambda: self.client.set_terminated(mlflow_run, status))
