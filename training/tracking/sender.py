"""The sender: one thread per process that imports MLflow and makes its calls in order.

Importing MLflow takes seconds, and a tracking server may be slow or gone; the training
process, a trial's task or a promotion never waits for either. The tracker asks
(``_later``) and returns at once; the sender thread imports MLflow, makes a client, and
makes the calls in the order they were asked for. ``flush`` (at the end of a task, and at
exit) waits until the calls asked for are made.

Every call goes through ``_safely``: a server that does not answer logs one warning
naming what failed and why, and tracking is off for the rest of the process, so a night
never waits on or fails for MLflow; a call the server refuses (say, a model version whose
source is a local path, which a remote server does not take) is a warning for that call
alone. The client retries an HTTP call once and waits at most
``MLFLOW_HTTP_REQUEST_TIMEOUT`` (10 s here unless set).
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("training")


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be reached (MLflow wraps requests'
    connection errors in an MlflowException that names them)."""
    text = f"{type(exc).__name__}: {exc}"
    return isinstance(exc, (OSError, TimeoutError)) or any(
        mark in text for mark in ("Max retries exceeded", "Connection refused",
                                  "ConnectionError", "timed out", "Read timed out",
                                  "NewConnectionError", "RemoteDisconnected"))


class MlflowSender:
    """A tracking server's client, made and called on the sender thread (module doc)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client: Any = None
        self.stopped: str | None = None
        # The last calls not made, and why, numbered (``missed_since``); how many so far.
        self._missed: collections.deque[tuple[int, str]] = collections.deque(maxlen=100)
        self.missed_count = 0
        self._calls: queue.Queue[Callable[[], Any]] = queue.Queue()
        self._ready = threading.Event()
        self._sender: threading.Thread | None = None
        self._starting = threading.Lock()
        atexit.register(self.flush)

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
        if self.stopped:
            self._miss(f"{what}: not sent, tracking had stopped ({self.stopped})")
            return
        self.warm()
        self._calls.put(lambda: self._safely(what, call))

    def _miss(self, reason: str) -> None:
        self._missed.append((self.missed_count, reason))
        self.missed_count += 1

    def missed_since(self, mark: int) -> list[str]:
        """The calls MLflow did not get since ``missed_count`` was ``mark``, and why,
        oldest first (the last 100 at most): what a promotion's task reports in an alert
        (``training_airflow``)."""
        return [reason for number, reason in list(self._missed) if number >= mark]

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

    def _safely(self, what: str, call: Callable[[], Any]) -> Any:
        if self.stopped:
            self._miss(f"{what}: not sent, tracking had stopped ({self.stopped})")
            return None
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - tracking never fails a night
            reason = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            self._miss(reason)
            if not _unreachable(exc):  # the server answered: this call alone is refused
                log.warning("warning: MLflow refused %s (%s); tracking goes on", what, reason)
                return None
            self.stopped = reason
            log.warning("warning: MLflow tracking stopped for this process (%s at %s); the "
                        "run goes on, and `python -m training models sync-mlflow` repairs "
                        "the registry's mirror later", self.stopped, self.uri)
            return None
