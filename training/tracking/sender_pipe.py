"""The tracked process's half of the pipe to its sender process (``tracking_process.py``).

``SenderProcess`` starts ``python -m training.tracking.tracking_process URI`` and writes
each call to its stdin as a length-prefixed pickle (a method name of ``MlflowTracker`` and
its arguments: a private pipe to our own child); a reader thread turns each of the
process's JSON answers into ``reported(made, missed, stopped, records)``. When the process
ends before it made what it was handed, those calls are missed and tracking stops, with
one warning (``sender.py`` says why a process and not a thread).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

HEADER = struct.Struct(">I")  # each call's length, then its pickle
Reported = Callable[[int, list[str], "str | None", list[tuple[int, str]]], None]


class SenderProcess:
    """The sender process of tracking URI ``uri``, seen from the tracked process."""

    def __init__(self, uri: str, reported: Reported) -> None:
        self.reported = reported
        self.gone: str | None = None
        self.closing = False
        self.sent = self.answered = 0
        root = Path(__file__).resolve().parents[2]  # where ``training`` is imported from
        env = dict(os.environ)
        if root.name not in ("site-packages", "dist-packages"):
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        try:
            self.process: Any = subprocess.Popen(
                [sys.executable, "-m", "training.tracking.tracking_process", uri],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        except OSError as exc:
            self.process = None
            self._ended(f"the MLflow sender process did not start ({exc})")
            return
        threading.Thread(target=self._read, name="mlflow-answers", daemon=True).start()

    def send(self, frame: tuple[str, str, tuple, dict]) -> str | None:
        """Hand the process one call; why it was not handed, or None."""
        if self.gone:
            return self.gone
        try:
            data = pickle.dumps(frame)
        except Exception as exc:  # noqa: BLE001 - this call alone is lost
            return f"its arguments could not be handed over ({type(exc).__name__}: {exc})"
        self.sent += 1  # before the write: a process that dies now counts it as not made
        try:  # (counted twice at worst, and a flush never waits for a call counted never)
            self.process.stdin.write(HEADER.pack(len(data)) + data)
            self.process.stdin.flush()
        except (OSError, ValueError):
            return self.gone or "the MLflow sender process had ended"
        return None

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the pipe; the process ends after the calls it holds."""
        if self.process is None:
            return
        self.closing = True
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            self.answered += answer["made"]
            self.reported(answer["made"], answer["missed"], answer["stopped"],
                          [(level, text) for level, text in answer["records"]])
        code = self.process.wait()
        self._ended(f"the MLflow sender process ended (exit {code})")

    def _ended(self, why: str) -> None:
        """After the process ended: the calls it was handed and never made are missed,
        and tracking stops; after ``close``, with every call made, nothing is said."""
        self.gone = why
        left = self.sent - self.answered
        if left or not self.closing:
            self.answered = self.sent
            self.reported(left, [f"{left} calls: not made, {why}"] if left else [], why, [(
                logging.WARNING, f"warning: MLflow tracking stopped for this process "
                f"({why}); the run goes on, and `python -m training models sync-mlflow` "
                f"repairs the registry's mirror later")])
