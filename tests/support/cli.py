"""``python -m training`` run as a user runs it: a real subprocess, and its output read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None,
        timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m training ARGS`` in ``cwd``, this environment plus ``env``."""
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=cwd,
                          env={**os.environ, "PYTHONUNBUFFERED": "1",
                               "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def streamed(args: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
             on_line: Callable[[subprocess.Popen, str], None] | None = None,
             hang_guard_s: float = 600) -> tuple[int, list[str]]:
    """``python -m training ARGS`` in its own session, stdout and stderr as one stream of
    lines, each seen by ``on_line(proc, line)`` as it comes (to signal it mid-epoch);
    (exit status, lines). A process still running after ``hang_guard_s`` is killed: a
    hang fails the test on its status (nothing here measures time)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "training", *args], cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
             **(env or {})})
    guard = threading.Timer(hang_guard_s, proc.kill)
    guard.start()
    lines: list[str] = []
    try:
        for raw in proc.stdout:
            lines.append(raw.rstrip("\n"))
            if on_line is not None:
                on_line(proc, lines[-1])
        return proc.wait(), lines
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def last_json(stdout: str, key: str | None = None) -> dict:
    """The last JSON line printed (the last one holding ``key``, if given)."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [d for d in lines if key is None or key in d][-1]


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The failure's single ``error:`` line; no traceback anywhere."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]
