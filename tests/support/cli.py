"""``python -m training`` run as a user runs it: a real subprocess, and its output read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None,
        timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m training ARGS`` in ``cwd``, this environment plus ``env``."""
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=cwd,
                          env={**os.environ, "PYTHONUNBUFFERED": "1",
                               "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


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
