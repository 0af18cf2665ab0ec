"""Child processes a launcher supervises: start, stop signals passed on, scratch space.

One mechanism for every launcher here (``training.launch.local``'s workers and
``training.launch.child.Child``, the one training child of ``python -m training run
--backend jax`` and of an Airflow task):

* ``start``: each child runs in its own process group (``start_new_session``), so
  stopping it stops whatever it started too; on Linux it also gets SIGTERM from the
  kernel if the thread that started it dies (``PR_SET_PDEATHSIG``), a SIGKILLed
  launcher included.
* ``on_stop_signals``: SIGTERM, SIGINT and SIGHUP to the launcher call a handler (the
  local launcher stops its workers, ``Child`` passes the signal on) for the duration of
  a ``with`` block, in the main thread only (Python delivers signals there; elsewhere,
  Airflow's task runner owns them), the previous handlers put back at the end.
* ``supervise`` waits until every process finished, one failed, the launcher got a stop
  signal or the deadline passed; ``stop`` sends SIGTERM to every process group still
  running and SIGKILL to what is left after the grace period.
* ``scratch_dir``: a launcher's directory in the system temp dir (the child's config,
  the staged dataset's description, the workers' ``TMPDIR``), removed at the end. A
  process killed by SIGKILL cannot remove its own, so its owner holds an ``flock`` on
  ``owner.lock`` inside while it lives (the kernel drops it when the process dies,
  however it dies) and the next ``scratch_dir`` of the same prefix removes every one
  whose lock is free. No pid is compared: a reused pid or another pid namespace
  sharing the temp dir cannot make a live directory look dead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
OWNER_LOCK = "owner.lock"  # in a scratch_dir: flocked by its owner while it lives


def _pdeathsig() -> Callable[[], None] | None:
    """What the child runs between fork and exec: ``prctl(PR_SET_PDEATHSIG, SIGTERM)``.
    libc is loaded here, in the parent: the child of a threaded parent (an Airflow task)
    must not import anything between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None

    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def set_pdeathsig() -> None:
        prctl(1, sigterm)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the starter died before the line above
            os.kill(os.getpid(), sigterm)

    return set_pdeathsig


def start(command: Sequence[str], env: dict[str, str], *, cwd: str | None = None,
          text: bool = True) -> subprocess.Popen:
    """Start ``command`` in its own process group, SIGTERM'd by the kernel if its
    starter dies; stdout and stderr as one pipe (text lines, or bytes)."""
    encoding: dict[str, Any] = {"text": True, "errors": "replace", "bufsize": 1} if text else {}
    return subprocess.Popen(
        list(command), env=env, cwd=cwd,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped as one
        preexec_fn=_pdeathsig(), **encoding,
    )


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int], None]) -> Iterator[bool]:
    """While the block runs, SIGTERM, SIGINT and SIGHUP call ``handler(signum)`` instead
    of their usual effect; the previous handlers are put back at the end. Yields
    whether they were installed: only in the main thread, where Python runs handlers
    (a launcher called from another thread leaves the signals to their owner)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {}
    try:
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, lambda signum, _frame: handler(signum))
        yield True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


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


def remove_abandoned(prefix: str) -> list[Path]:
    """Remove the ``scratch_dir``s of ``prefix`` whose owner is gone (its lock is free);
    the directories removed. Others' directories of that name (no ``owner.lock``, or
    one this user cannot open) are left alone."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            fd = os.open(path / OWNER_LOCK, os.O_RDWR)
        except OSError:  # not one of ours, another user's, or its owner is starting
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner lives
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory ``<temp dir>/<prefix>XXXX`` for the block, removed at its end;
    the ones of ``prefix`` that a killed process left are removed first."""
    remove_abandoned(prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix))
    fd = os.open(path / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
