"""The sender: MLflow's calls made by a process of their own, in the order they were asked.

Importing MLflow takes seconds of CPU, opening its store more (a new SQLite store makes
its tables), and a tracking server may be slow or gone; the training process, a trial's
task or a promotion never waits for any of it. A thread would still share the training
process's interpreter lock, so on a small machine MLflow's import would slow the
training it runs beside (benchmark 19: 1.37x on 2 cores). So the tracker asks
(``_later``: a method name and its arguments) and returns at once; its writer thread
starts the sender process (``tracking_process.py``, through ``sender_pipe.py``) and
hands it each call; that process imports MLflow, makes a client and makes the calls in
order, on another core, and reports after each call what MLflow did not get and what it
logged. ``flush`` (at the end of a task, and at exit) waits until the calls asked for
are made; closing the pipe ends the process, also when this one is killed.

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
    """What MLflow did not get, and the calls handed to the sender process (module doc)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client: Any = None  # only where the calls are made: the sender process, sync
        self.stopped: str | None = None
        # The last calls not made, and why, numbered (``missed_since``); how many so far.
        self._missed: collections.deque[tuple[int, str]] = collections.deque(maxlen=100)
        self.missed_count = 0
        self._frames: queue.Queue[tuple[str, str, tuple, dict] | None] = queue.Queue()
        self._asked = self._made = 0
        self._changed = threading.Condition()
        self._process: Any = None
        self._writer: threading.Thread | None = None
        self._starting = threading.Lock()
        atexit.register(self.close)

    def connect(self) -> None:
        """A client in this process (the sender process; ``sync``)."""
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        import mlflow

        self.client = mlflow.MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    def warm(self) -> None:
        """Start the sender process now (a process that will track soon: a trial's task
        while its trial trains). A process that asks for nothing (a validation, ``models
        list``) never starts it."""
        with self._starting:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="mlflow-tracking",
                                                daemon=True)
                self._writer.start()

    def _later(self, what: str, method: str, *args: Any, **kwargs: Any) -> None:
        """``self.<method>(*args, **kwargs)``, made by the sender process; returns at once."""
        if self.stopped:
            self._miss(f"{what}: not sent, tracking had stopped ({self.stopped})")
            return
        self.warm()
        with self._changed:
            self._asked += 1
        self._frames.put((what, method, args, kwargs))

    def _write(self) -> None:
        from training.tracking.sender_pipe import SenderProcess

        self._process = SenderProcess(self.uri, self._reported)
        while (frame := self._frames.get()) is not None:
            if (why := self._process.send(frame)) is not None:
                self._reported(1, [f"{frame[0]}: not sent, {why}"], self._process.gone, [])
        self._process.close()

    def _reported(self, made: int, missed: list[str], stopped: str | None,
                  records: list[tuple[int, str]]) -> None:
        """What the sender process says after a call (``made`` calls more were made)."""
        for level, message in records:
            log.log(level, "%s", message)
        for reason in missed:
            self._miss(reason)
        self.stopped = self.stopped or stopped
        with self._changed:
            self._made += made
            self._changed.notify_all()

    def _miss(self, reason: str) -> None:
        self._missed.append((self.missed_count, reason))
        self.missed_count += 1

    def missed_since(self, mark: int) -> list[str]:
        """The calls MLflow did not get since ``missed_count`` was ``mark``, and why,
        oldest first (the last 100 at most): what a promotion's task reports in an alert
        (``training_airflow``)."""
        return [reason for number, reason in list(self._missed) if number >= mark]

    def flush(self, timeout_s: float = 300.0) -> bool:
        """Wait until every call asked for so far was made (or tracking stopped); whether
        it was. The wait ends early only when no call was made for ``timeout_s``: a
        sender process at ``nice`` 10 on a machine whose cores are busy is slow, not
        stuck, and each of its calls is bounded by the client's HTTP timeout, so a slow
        one still delivers. A process calls it before it exits (also at exit); a task,
        before it ends; a process before it starts others that log to its run."""
        with self._changed:
            while self._made < self._asked:
                if not self._changed.wait_for(lambda made=self._made: self._made > made,
                                              timeout_s):
                    break  # no call made for timeout_s
            left = self._asked - self._made
        if left > 0:
            log.warning("warning: MLflow tracking: %d calls not made, none for %.0f s (%s); "
                        "the run goes on without them", left, timeout_s, self.uri)
        return left <= 0

    def close(self) -> None:
        """Flush, then end the sender process (at exit; a test's tracker it drops)."""
        if self._writer is not None and self._writer.is_alive():
            self.flush()
            self._frames.put(None)
            self._writer.join(timeout=10)

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
