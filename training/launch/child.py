"""One child process of a step, ``python -m training COMMAND``: started, streamed, stopped.

An Airflow task never loads TensorFlow; what needs it runs as a child process of the
task (``training.launch.command.TrainingCommand``), and so does the JAX training of
``python -m training run --backend jax``. ``Child`` starts it
(``training.launch.processes.start``: its own process group, SIGTERM from the kernel if
its starter dies) in the given working directory, hands every line it prints to
``on_line`` as it comes (stdout and stderr as one stream), except TensorFlow's CUDA
probing noise, and returns its exit code, the message of its last ``error:`` line and
the JSON objects it printed, one per line, merged (``{"staged": ...}``). ``stop()`` (a
task killed, timed out, its worker shut down) sends SIGTERM to the whole group, and so
does any exception while it streams.

Its own process group keeps a terminal's Ctrl-C and a signal to the parent alone from
reaching it. With ``forward_signals`` (the CLI's ``run``, in the main thread) SIGTERM and
SIGINT to the parent are passed on to the child's group while it runs, and SIGHUP, which
training does not handle, as SIGTERM (``processes.on_stop_signals``, the handlers put
back afterwards); the parent then waits for the child's exit (143 after a mid-epoch
backup). Airflow's task runner owns SIGTERM in a task (it calls ``on_kill``, which calls
``stop()``), so a task's ``Child`` leaves the signals alone.

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

from training.launch import processes

ERROR_PREFIX = "error: "  # how ``training.entry.run_command`` writes a failure
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
    """How a child ended: its exit code (negative: killed by that signal), the message of
    its last ``error:`` line (the prefix left out), its JSON lines, the signals passed on."""

    code: int
    error: str | None = None
    results: dict[str, Any] = field(default_factory=dict)
    forwarded: list[int] = field(default_factory=list)


class Child:
    """``command`` as a child process in its own process group."""

    def __init__(self, command: Sequence[str], env: dict[str, str], cwd: str, *,
                 forward_signals: bool = False) -> None:
        self.command, self.env, self.cwd = list(command), env, cwd
        self.forward_signals = forward_signals
        self.proc: subprocess.Popen | None = None
        self.forwarded: list[int] = []

    def run(self, on_line: Callable[[str], None]) -> ChildResult:
        """Start it, stream its lines to ``on_line`` (noise left out), wait for its end."""
        signals = (processes.on_stop_signals(self._forward) if self.forward_signals
                   else contextlib.nullcontext())
        with signals:
            self.proc = processes.start(self.command, self.env, cwd=self.cwd, text=False)
            for signum in self.forwarded:  # came while it was starting
                self._send(signum)
            result = self._stream(on_line)
            result.code = self.proc.wait()
        result.forwarded = list(self.forwarded)
        return result

    def _stream(self, on_line: Callable[[str], None]) -> ChildResult:
        assert self.proc is not None and self.proc.stdout is not None
        result = ChildResult(code=0)
        try:
            for raw in self.proc.stdout:
                line = raw.decode(errors="backslashreplace").rstrip()
                if is_noise(line):
                    continue
                on_line(line)
                if line.startswith(ERROR_PREFIX):
                    result.error = line.removeprefix(ERROR_PREFIX)
                elif line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        result.results.update(json.loads(line))
        except BaseException:  # a timeout or a kill of the task: the child goes with it
            self.stop()
            raise
        finally:
            self.proc.stdout.close()
        return result

    def _forward(self, signum: int) -> None:
        """A stop signal to this process: the same to the child's group (SIGHUP as
        SIGTERM); it stops in its own way, and ``run`` waits for its exit."""
        self.forwarded.append(signum)
        self._send(signum)

    def _send(self, signum: int) -> None:
        if self.running():
            assert self.proc is not None
            sent = signal.SIGTERM if signum == signal.SIGHUP else signum
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sent)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the child's process group, if it still runs."""
        if self.running():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
