"""Shared helpers of the benchmark scripts: medians, ratios, targets, a clean exit.

Every script measures its pairs side by side in one run, repeats each measurement,
prints the medians and the ratio last, and exits 1 when a target is missed.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {platform.platform()}")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_python(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
                          cwd=cwd)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return proc.stdout


class Report:
    """Collects figures and target checks; ``finish()`` prints them and exits."""

    def __init__(self, title: str):
        self.title = title
        self.lines: list[str] = []
        self.missed: list[str] = []

    def figure(self, text: str) -> None:
        self.lines.append(text)
        print(text, flush=True)

    def target(self, name: str, ok: bool, detail: str) -> None:
        verdict = "met" if ok else "MISSED"
        self.figure(f"target {name}: {verdict} ({detail})")
        if not ok:
            self.missed.append(name)

    def finish(self) -> None:
        print(f"\n== {self.title} ==  ({machine()})")
        for line in self.lines:
            print(line)
        if self.missed:
            print(f"missed targets: {', '.join(self.missed)}")
            sys.exit(1)
        print("all targets met")


def median(values: list[float]) -> float:
    return statistics.median(values)
