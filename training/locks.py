"""Exclusive claims on a run directory or a staging directory, held while work runs.

``claim(path, what)`` takes an exclusive ``flock`` on ``<path>.lock`` for the duration
of a ``with`` block and writes who holds it (pid, host, since when) into the file. A
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


def _lock_path(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(path)).with_name(Path(path).name + ".lock")


def _inherited() -> set[str]:
    return set(filter(None, os.environ.get(HELD_ENV, "").split(os.pathsep)))


def claimed_env() -> dict[str, str]:
    """Environment for a child that works under this process's claims."""
    return {HELD_ENV: os.pathsep.join(sorted(set(_held) | _inherited()))}


@contextlib.contextmanager
def claim(path: str | os.PathLike[str], what: str, *, wait_s: float = 0.0) -> Iterator[None]:
    """Hold ``<path>.lock`` exclusively; BusyError naming the holder if someone has it
    (after waiting up to ``wait_s`` seconds for it to let go)."""
    lock = _lock_path(path)
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
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise BusyError(f"{what} is in use: {_holder(fd)} holds {lock}; wait for "
                                    "it to finish, or stop it") from None
                if not told:
                    log.info("waiting for %s: %s holds %s", what, _holder(fd), lock)
                    told = True
                time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"process {info['pid']} on {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
