"""Exclusive claims on a run directory or a staging directory, held while work runs.

``claim(lock_file, what)`` takes an exclusive ``flock`` on ``lock_file`` for the
duration of a ``with`` block, writes who holds it (pid, host, since when) into the
file and removes it at the end (with the directories it had to create, if they are
still empty); ``claim_run(run_dir, run_id)`` is the claim on a run directory
(``<run_dir>/run.lock``). A
second claimant, in this process or another, gets ``BusyError`` at once, naming the
holder. The kernel drops the lock when its process dies, so a crash or SIGKILL never
leaves a stale claim behind: the next run simply takes it.

Nesting in one process is allowed (``python -m training run`` claims the run for the
whole command and ``train`` inside it claims it again). A process started by the
holder to work under its claim (the local multi-worker launcher's workers) gets
``TRAINING_CLAIMS_HELD`` in its environment (``claimed_env()``) and does not claim
again.

Local filesystems only: ``flock`` on a network filesystem may not exclude processes on
other hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from training.errors import BusyError

log = logging.getLogger(__name__)

HELD_ENV = "TRAINING_CLAIMS_HELD"
_held: dict[str, int] = {}  # lock path -> nesting depth, in this process


def _inherited() -> set[str]:
    """The claims a parent handed down: a JSON list of lock paths (a path may hold any
    character but NUL, ``os.pathsep`` included, so no separator would do)."""
    text = os.environ.get(HELD_ENV, "")
    try:
        paths = json.loads(text) if text else []
    except ValueError:
        paths = None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise BusyError(f"{HELD_ENV} must be a JSON list of lock paths, got {text[:200]!r}: "
                        "it is set by the process that holds the claims; unset it")
    return set(paths)


def claimed_env() -> dict[str, str]:
    """Environment for a child that works under this process's claims."""
    return {HELD_ENV: json.dumps(sorted(set(_held) | _inherited()))}


@contextlib.contextmanager
def claim(lock_file: str | os.PathLike[str], what: str, *,
          wait_s: float = 0.0) -> Iterator[None]:
    """Hold ``lock_file`` exclusively; BusyError naming the holder if someone has it
    (after waiting up to ``wait_s`` seconds for it to let go)."""
    lock = Path(os.path.abspath(lock_file))
    key = os.fspath(lock)
    if key in _held or key in _inherited():
        _held[key] = _held.get(key, 0) + 1
        try:
            yield
        finally:
            _held[key] -= 1
            if not _held[key]:
                del _held[key]
        return
    created = [d for d in (lock.parent, *lock.parent.parents) if not d.exists()]
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = _locked(lock, what, wait_s)
    try:
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
            # Still holding it: remove the file, and the directories the claim created if
            # nothing else landed in them (a refused run leaves no trace).
            with contextlib.suppress(OSError):
                os.unlink(lock)
            for directory in created:  # deepest first
                with contextlib.suppress(OSError):
                    directory.rmdir()
    finally:
        os.close(fd)  # releases the flock


def _locked(lock: Path, what: str, wait_s: float) -> int:
    """A descriptor of ``lock`` holding its flock. A holder removes the file when it lets
    go, so the lock taken must still be the file at that path (else: open it again)."""
    deadline, told = time.monotonic() + wait_s, False
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if time.monotonic() >= deadline:
                raise BusyError(f"{what} is in use: {holder} holds {lock}; wait for it to "
                                "finish, or stop it") from None
            if not told:
                log.info("waiting for %s: %s holds %s", what, holder, lock)
                told = True
            time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
            continue
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # removed by its last holder after we opened it: try again


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"process {info['pid']} on {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def claim_run(run_dir: str | os.PathLike[str], run_id: str) -> contextlib.AbstractContextManager:
    """The claim on a run directory: training, evaluating and publishing hold it."""
    return claim(Path(run_dir) / "run.lock", f"run directory {run_dir} (run {run_id})")
