"""SIGTERM during ``model.fit``: stop at the end of a batch, with a backup, exit 143.

Keras 3 has no ``save_before_preemption``; this is its replacement for one worker.
``stop_on_sigterm`` installs a handler for the duration of ``model.fit`` that only sets
a flag (``stop_signal``) on the backup callback
(``training.train.callbacks.backup.ResumableBackup``). The callback acts on it at the end
of the batch running then (or of the first batch, when the signal came while ``fit`` was
starting an epoch): it writes a backup marked ``mid_epoch`` and raises
``training.errors.Preempted``, a ``SystemExit`` with code 143 (128 + SIGTERM), so
``python -m training train`` exits 143 as a process killed by SIGTERM would. A signal
that arrives during validation or the epoch-end callbacks is acted on after that epoch's
ordinary backup, once every callback has seen the epoch end (a sweep's pruning report,
the epoch's tracking), before the next epoch begins. Acting inside the handler itself
would interrupt arbitrary Python code, a half-written backup included.

The previous handler is restored when ``fit`` returns; a signal that came after the last
epoch is then handed to it. A step stuck in TensorFlow (an all-reduce that never
completes) never lets the Python handler run: a watchdog thread exits 143 without a
backup when no batch has ended ``grace_s`` seconds after the signal.

Under several workers the handler is not installed: a SIGTERM on one worker cannot
coordinate a save across workers (the others may be blocked in the next step's
all-reduce), so the worker dies as before, the launcher stops the others and a re-run
resumes from the last epoch backup.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any, Protocol

log = logging.getLogger(__name__)

EXIT_CODE = 128 + signal.SIGTERM
SIGTERM_GRACE_S = 60.0  # after SIGTERM, the longest wait for the end of a batch


class Stoppable(Protocol):
    """What ``stop_on_sigterm`` flags: the callback that stops training (``ResumableBackup``)."""

    stop_signal: int | None


def _exit_if_stuck(read_fd: int, grace_s: float, done: threading.Event) -> None:
    """Watchdog thread: Python runs a signal handler only when the main thread comes back
    to the interpreter, which a step stuck in TensorFlow (an all-reduce that never
    completes) never does. The C-level handler still writes the signal to the wakeup
    descriptor; if the block has not ended ``grace_s`` seconds later (``done``), the
    process exits with 143 anyway."""
    with open(read_fd, "rb", buffering=0) as wakeups:
        while data := wakeups.read(64):
            if signal.SIGTERM not in data:
                continue
            if done.wait(grace_s):  # training stopped (or the block ended) in time
                return
            log.error("SIGTERM %.0f s ago and training has not reached the end of a batch "
                      "(a step is stuck, e.g. waiting for an all-reduce): exiting without "
                      "a backup", grace_s)
            logging.shutdown()
            os._exit(EXIT_CODE)


@contextlib.contextmanager
def stop_on_sigterm(backup: Stoppable, *, enabled: bool = True,
                    grace_s: float = SIGTERM_GRACE_S) -> Iterator[None]:
    """While the block runs, SIGTERM makes ``backup`` stop training at the end of the
    current batch with a backup and ``Preempted`` (exit status 143); if no batch ends
    within ``grace_s`` seconds (a stuck step), the process exits 143 without a backup.

    ``grace_s`` is a parameter so that a test can run the real watchdog in seconds.
    Not installed when ``enabled`` is false (several workers: see the module docstring)
    or outside the main thread (Python only delivers signals there). The previous
    handler is restored at the end; a SIGTERM that came after the last batch, when
    training had nothing left to back up, is then handed to it.
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame: Any) -> None:
        if backup.stop_signal is None:
            log.warning("%s received: stopping at the end of this batch after writing "
                        "a backup", signal.Signals(signum).name)
        backup.stop_signal = signum

    backup.stop_signal = None
    previous = signal.signal(signal.SIGTERM, handle)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    done = threading.Event()
    threading.Thread(target=_exit_if_stuck, args=(read_fd, grace_s, done), daemon=True,
                     name="sigterm-watchdog").start()
    try:
        yield
    finally:  # None: a handler not set from Python, which cannot be put back
        done.set()
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)  # the watchdog sees EOF and ends
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if backup.stop_signal is not None:
        log.warning("SIGTERM arrived after the last batch; handing it on")
        backup.stop_signal = None
        signal.raise_signal(signal.SIGTERM)
