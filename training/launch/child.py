"""One child process of a step, ``python -m training COMMAND``: started, streamed, stopped.

An Airflow task never loads TensorFlow; what needs it runs as a child process of the
task (``training.launch.command.TrainingCommand``). ``Child`` starts it in its own process group in
the given working directory, hands every line it prints to ``on_line`` as it comes
(stdout and stderr as one stream), except TensorFlow's CUDA probing noise, and returns
its exit code, its last ``error:`` line and the JSON objects it printed, one per line,
merged (``{"staged": ...}``). ``stop()`` (a task killed, timed out, its worker shut
down) sends SIGTERM to the whole group, and so does any exception while it streams.

The noise: a TensorFlow built with CUDA support writes, on a machine without a GPU
driver, lines such as ``cudart_stub.cc:31] Could not find cuda drivers on your machine``
and ``cuda_platform.cc:52] failed call to cuInit`` straight to file descriptor 2, some of
them before its logging is initialised (so ``TF_CPP_MIN_LOG_LEVEL`` cannot hide them).
Airflow 3 logs everything a task process writes to stderr as ERROR, so a healthy CPU run
showed five ERROR lines per task. ``is_noise`` matches those lines and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|cuda_(dnn|fft|blas)\.cc:\d+\] Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation_placer\.cc:\d+\] computation placer already registered"
)


def is_noise(line: str) -> bool:
    """Whether ``line`` is TensorFlow's CUDA probing noise and nothing else."""
    return NOISE.search(line) is not None


@dataclass
class ChildResult:
    """How a child ended: its exit code, its last ``error:`` line, its JSON lines."""

    code: int
    error: str | None = None
    results: dict[str, Any] = field(default_factory=dict)


class Child:
    """``command`` as a child process in its own process group."""

    def __init__(self, command: Sequence[str], env: dict[str, str], cwd: str) -> None:
        self.command, self.env, self.cwd = list(command), env, cwd
        self.proc: subprocess.Popen | None = None

    def run(self, on_line: Callable[[str], None]) -> ChildResult:
        """Start it, stream its lines to ``on_line`` (noise left out), wait for its end."""
        self.proc = subprocess.Popen(self.command, env=self.env, cwd=self.cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        result = ChildResult(code=0)
        assert self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                line = raw.decode(errors="backslashreplace").rstrip()
                if is_noise(line):
                    continue
                on_line(line)
                if line.startswith("error: "):
                    result.error = line
                elif line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        result.results.update(json.loads(line))
        except BaseException:  # a timeout or a kill of the task: the child goes with it
            self.stop()
            raise
        finally:
            self.proc.stdout.close()
        result.code = self.proc.wait()
        return result

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the child's process group, if it still runs."""
        if self.running():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
