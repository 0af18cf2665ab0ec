"""Child processes the launcher supervises: start, watch for the first failure, stop.

Each worker runs in its own process group (``start_new_session``), so stopping it stops
whatever it started too; on Linux it also gets SIGTERM from the kernel if the launcher
dies (``PR_SET_PDEATHSIG``). ``supervise`` waits until every process finished, one
failed, the launcher got a stop signal or the deadline passed; ``stop`` sends SIGTERM to
every process group still running and SIGKILL to what is left after the grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence


def _pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start(command: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
    """Start ``command`` in its own process group; stdout and stderr as one text pipe."""
    return subprocess.Popen(
        list(command), env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", bufsize=1,
        start_new_session=True,  # its own process group: stopped as one
        preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,
    )


def shell_status(code: int) -> int:
    """A process exit status as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def describe(code: int) -> str:
    """``exited with status N`` or ``was killed by SIGNAME``, for a Popen returncode."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def supervise(procs: list[subprocess.Popen], expected: int, stop_signal: list[int],
              timeout_s: float | None) -> tuple[int, int | None, str]:
    """Wait for every worker; (returncode, failed worker, reason) at the first failure.

    stop_signal: filled by the launcher's signal handler; expected: how many processes
    should have been started (fewer: a stop signal came while starting them)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if stop_signal:
            sig = signal.Signals(stop_signal[0])
            return 128 + sig.value, None, f"the launcher received {sig.name}"
        if len(procs) < expected:
            return 1, None, "not every worker started"
        codes = [p.poll() for p in procs]
        for index, code in enumerate(codes):
            if code not in (None, 0):
                return (shell_status(code) or 1, index,
                        f"worker {index} {describe(code)}; stopping the others")
        if all(code == 0 for code in codes):
            return 0, None, ""
        if deadline is not None and time.monotonic() > deadline:
            return 124, None, f"the workers did not finish within {timeout_s:g} s"
        time.sleep(0.1)


def stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every running worker's process group, SIGKILL what is left after grace_s."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in running:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
