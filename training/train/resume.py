"""Resume after preemption or a crash: BackupAndRestore plus the callbacks' own state.

Keras 3's ``BackupAndRestore`` backs up the model's weights, the optimizer's state and
the number of finished epochs; it does not save what the other callbacks have learned,
and it has no ``save_before_preemption``. A restarted ``fit`` therefore forgets that
EarlyStopping had waited 2 epochs since its best value (and that value, and the best
weights), that ReduceLROnPlateau had waited 1 and already lowered the learning rate,
and which value ModelCheckpoint has to beat. ``ResumableBackup`` adds that state, and
``stop_on_sigterm`` turns SIGTERM into "write a backup, then exit 143".

How the restore order is achieved
---------------------------------
``ResumableBackup`` is a ``BackupAndRestore`` subclass placed **after** EarlyStopping,
ReduceLROnPlateau, ModelCheckpoint and CSVLogger in the callback list
(``fit.make_callbacks``); ``model.fit`` calls each hook on the callbacks in list order,
then on the History and progress-bar callbacks it appends itself.

* ``on_train_begin``: the other callbacks have just reset themselves (EarlyStopping's
  ``on_train_begin`` sets ``wait = 0, best = None``; ReduceLROnPlateau's does the same).
  Only then does ``ResumableBackup`` load the backup (Keras's own
  ``BackupAndRestore.on_train_begin``: weights, optimizer, epoch; under several workers
  the ``backup_restore_sync`` patch of ``training.train.compat`` broadcasts the chief's) and
  write the saved counters, best values, best weights and learning rate back into those
  callbacks. Nothing the others do in ``on_train_begin`` needs the restored weights, so
  loading last is safe; ``model.fit`` reads the restored epoch after every
  ``on_train_begin`` has run.
* ``on_epoch_end``: the others have updated themselves for this epoch (EarlyStopping
  took the best weights, ReduceLROnPlateau lowered the learning rate, ModelCheckpoint
  and CSVLogger wrote), so one backup now captures weights, optimizer (with the new
  learning rate) and callback state of the same moment. Keras's own per-epoch save is
  replaced by that one (plain ``BackupAndRestore`` saves first in the list, before
  ReduceLROnPlateau lowers the rate, and in place).

The backup as a transaction
---------------------------
Each backup is written whole into ``<backup_dir>.new/``, fsynced, then swapped in by
two renames (``backup -> backup.old``, ``backup.new -> backup``); ``on_train_begin``
finishes a swap that a crash interrupted. So weights, ``training_metadata.json`` (Keras's
file: the epoch to resume at) and our state always belong to the same moment. The
directory holds:

* ``latest.weights.h5``, ``training_metadata.json``  Keras's BackupAndRestore files;
* ``best.weights.h5``  EarlyStopping's best weights, a Keras weights file (written from
  the model in the epoch that EarlyStopping took them, when they *are* the model's
  weights; copied forward from the previous backup otherwise);
* ``resume_state.json``  self-describing and versioned (``format``, ``version``): the
  callbacks' attributes verbatim (epoch indices 0-based, as Keras keeps them), the
  learning rate, the history so far, and ``mid_epoch`` for a backup taken by SIGTERM.

``BackupAndRestore.on_train_end`` removes the directory when training ends (finished
or stopped early), as before.

SIGTERM
-------
``stop_on_sigterm`` installs a handler for the duration of ``model.fit`` that only sets
a flag; ``ResumableBackup`` acts on it at the end of the batch running then (or of
the first batch, when the signal came while ``fit`` was starting an epoch): it writes a
backup marked ``mid_epoch`` (weights after the batches done; the epoch count is the
finished epochs, so a re-run repeats the interrupted epoch from its start) and raises
``Preempted``, a ``SystemExit`` with code 143 (128 + SIGTERM), so ``python -m training
train`` exits 143 as a process killed by SIGTERM would. A signal that arrives during
validation or the epoch-end callbacks is acted on right after that epoch's ordinary
backup. The previous
handler is restored when ``fit`` returns; a signal that came after the last epoch is
then handed to it. Acting inside the handler itself would interrupt arbitrary Python
code, a half-written backup included.

Under several workers the handler is not installed: a SIGTERM on one worker cannot
coordinate a save across workers (the others may be blocked in the next step's
all-reduce), so the worker dies as before, the launcher stops the others and a re-run
resumes from the last epoch backup. Non-chief workers write their backups to their
temporary run directory; on restore they receive the chief's state by broadcast (the
same all-reduce as ``backup_restore_sync``), so every worker's EarlyStopping and
ReduceLROnPlateau decide alike.

This module imports Keras; ``training.train.fit`` imports it where it trains.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np

from training.files import fsync_path
from training.train import compat

log = logging.getLogger(__name__)

FORMAT = "training.resume/state"
VERSION = 1
STATE_FILE = "resume_state.json"
BEST_WEIGHTS_FILE = "best.weights.h5"
WEIGHTS_FILE = "latest.weights.h5"  # Keras BackupAndRestore's names
METADATA_FILE = "training_metadata.json"
RESTORED_MARK = "resume state restored:"  # the INFO line logged after a restore
EXIT_CODE = 128 + signal.SIGTERM


class Preempted(SystemExit):
    """Training stopped on a signal after writing a backup.

    A ``SystemExit`` so that ``python -m training train`` exits ``128 + signum`` (143
    for SIGTERM) without every caller having to know about it; in-process callers can
    catch it by name.
    """

    def __init__(self, signum: int, *, epoch: int, batch: int, backup_dir: str) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.epoch = epoch  # 1-based: the epoch a re-run starts with
        self.batch = batch  # batches of it done before the stop (0: stopped between epochs)
        self.backup_dir = backup_dir


def _float(value: Any) -> float | None:
    return None if value is None else float(np.asarray(value))


class ResumableBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore that also saves and restores the other callbacks' state.

    Place it after ``early_stopping``, ``reduce_lr`` and ``checkpoint`` in the callback
    list (see the module docstring for why). ``epochs`` and ``metrics`` hold the whole
    run's history, epochs before a restart included.
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike,
        *,
        early_stopping: keras.callbacks.EarlyStopping,
        reduce_lr: keras.callbacks.ReduceLROnPlateau,
        checkpoint: keras.callbacks.ModelCheckpoint,
        min_interval_s: float = 0.0,
    ) -> None:
        # Kept until the caller has saved the model (fit.train removes it then): a crash
        # while saving must not lose the finished training.
        super().__init__(backup_dir=os.fspath(backup_dir), delete_checkpoint=False)
        self.early_stopping = early_stopping
        self.reduce_lr = reduce_lr
        self.checkpoint = checkpoint
        self.epochs: list[int] = []  # 0-based, as History.epoch
        self.metrics: dict[str, list[float]] = {}
        self.restored: dict[str, Any] | None = None  # describe() right after a restore
        self.stop_signal: int | None = None
        self._epoch = 0  # index of the epoch in progress
        self._best_saved: Any = None  # the best_weights object best.weights.h5 holds
        # Epoch-end backups at most this often (short epochs would spend more time
        # backing up than training); a stop (SIGTERM, EarlyStopping) always writes one.
        self.min_interval_s = min_interval_s
        self._last_commit = time.monotonic()

    # --- paths -----------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return Path(self.backup_dir)

    def _sibling(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    # --- state -----------------------------------------------------------------------
    def _learning_rate(self) -> float | None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return None
        return float(keras.ops.convert_to_numpy(optimizer.learning_rate))

    def describe(self) -> dict[str, Any]:
        """The resumable state of the callbacks now (what a backup saves)."""
        es, rlr, ckpt = self.early_stopping, self.reduce_lr, self.checkpoint
        return {
            "early_stopping": {
                "monitor": es.monitor, "wait": int(es.wait), "best": _float(es.best),
                "best_epoch": int(getattr(es, "best_epoch", 0)),
                "stopped_epoch": int(es.stopped_epoch),
                "best_weights": BEST_WEIGHTS_FILE if es.best_weights is not None else None,
            },
            "reduce_lr_on_plateau": {
                "monitor": rlr.monitor, "wait": int(rlr.wait), "best": _float(rlr.best),
                "cooldown_counter": int(rlr.cooldown_counter),
            },
            "model_checkpoint": {"monitor": ckpt.monitor, "best": _float(ckpt.best)},
            "learning_rate": self._learning_rate(),
        }

    def _state(self, epochs_completed: int, mid_epoch: dict[str, Any] | None) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "description": (
                "Callback state saved with the Keras BackupAndRestore files of this "
                "directory (training.train.resume). callbacks: the Keras callbacks' attributes "
                "(epoch indices 0-based); epochs_completed: the epoch count in "
                "training_metadata.json; mid_epoch: set when a signal stopped training "
                "inside an epoch (the weights are from that point; a re-run repeats "
                "the epoch from its start); stop_training: a callback (EarlyStopping) "
                "had ended training, so a re-run trains no further epoch."
            ),
            "epochs_completed": epochs_completed,
            "mid_epoch": mid_epoch,
            "stop_training": bool(getattr(self.model, "stop_training", False)),
            "callbacks": self.describe(),
            "history": {"epochs": [e + 1 for e in self.epochs], "metrics": self.metrics},
        }

    # --- writing a backup --------------------------------------------------------------
    def _write_best_weights(self, directory: Path) -> None:
        best = self.early_stopping.best_weights
        if best is None:
            return
        target = directory / BEST_WEIGHTS_FILE
        previous = self.path / BEST_WEIGHTS_FILE
        if best is self._best_saved and previous.exists():
            shutil.copyfile(previous, target)
            return
        # The best weights are arrays (EarlyStopping copied them from the model at the
        # best epoch); a Keras weights file is written from a model, so the model holds
        # them while it is written. With backups less often than every epoch the best
        # epoch may be an earlier one than this. Every worker does the same (no
        # collective op: assigning mirrored variables in cross-replica context is local).
        now = self.model.get_weights()
        same = len(now) == len(best) and all(np.array_equal(a, b)
                                             for a, b in zip(now, best, strict=True))
        if not same:
            self.model.set_weights(best)
        try:
            self.model.save_weights(os.fspath(target))
        finally:
            if not same:
                self.model.set_weights(now)
        self._best_saved = best

    def _commit(self, epochs_completed: int, mid_epoch: dict[str, Any] | None = None) -> None:
        """Write a complete backup into ``<dir>.new``, then swap it in."""
        new, old = self._sibling(".new"), self._sibling(".old")
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(parents=True)
        self.model.save_weights(os.fspath(new / WEIGHTS_FILE))
        batch = mid_epoch["batches_done"] if mid_epoch else 0
        (new / METADATA_FILE).write_text(json.dumps({"epoch": epochs_completed,
                                                     "batch": batch}))
        self._write_best_weights(new)
        (new / STATE_FILE).write_text(
            json.dumps(self._state(epochs_completed, mid_epoch), indent=1) + "\n")
        for child in new.iterdir():
            fsync_path(child)
        fsync_path(new)
        if self.path.exists():
            shutil.rmtree(old, ignore_errors=True)
            self.path.rename(old)
        new.rename(self.path)
        fsync_path(self.path.parent)
        shutil.rmtree(old, ignore_errors=True)

    def _recover(self) -> None:
        """Finish a swap that a crash interrupted; drop half-written backups."""
        new, old = self._sibling(".new"), self._sibling(".old")
        if not self.path.exists():
            if (new / STATE_FILE).exists():  # complete (the state is written last)
                new.rename(self.path)
            elif old.exists():
                old.rename(self.path)
        shutil.rmtree(new, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)

    # --- restoring ---------------------------------------------------------------------
    def _read_state(self) -> dict[str, Any] | None:
        path = self.path / STATE_FILE
        if not path.exists():
            return None
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("resume: cannot read %s (%s); callback state starts fresh", path, exc)
            return None
        if state.get("format") != FORMAT or state.get("version") != VERSION:
            log.warning("resume: %s is %r version %r, this code reads %r version %d; "
                        "callback state starts fresh", path, state.get("format"),
                        state.get("version"), FORMAT, VERSION)
            return None
        return state

    def _load_best_weights(self) -> list[Any]:
        """EarlyStopping's best weights from the backup, through the model (whose
        weights ``BackupAndRestore`` loads right after)."""
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        self.model.load_weights(os.fspath(self.path / BEST_WEIGHTS_FILE))
        return self.model.get_weights()

    def _broadcast(self, strategy: Any, state: dict[str, Any] | None,
                   best: list[Any] | None) -> tuple[dict[str, Any] | None, list[Any] | None]:
        """Every worker gets the chief's state and best weights (two or three
        all-reduces, run by every worker in step)."""
        blob = json.dumps(state).encode() if state is not None else b""
        (size,) = compat._broadcast_from_replica_0(strategy, [np.int64(len(blob))])
        size = int(size)
        if size == 0:
            return None, None
        mine = np.zeros(size, np.int32)
        mine[:min(size, len(blob))] = np.frombuffer(blob, np.uint8)[:size]
        (chars,) = compat._broadcast_from_replica_0(strategy, [mine])
        state = json.loads(bytes(np.asarray(chars, np.uint8)).decode())
        if state["callbacks"]["early_stopping"]["best_weights"] is None:
            return state, None
        template = self.model.get_weights()
        best = best if best is not None else [np.zeros_like(w) for w in template]
        synced = compat._broadcast_from_replica_0(strategy, best)
        return state, [np.asarray(w) for w in synced]

    def _matches(self, state: dict[str, Any], epoch: int) -> bool:
        problems = []
        if state["epochs_completed"] != epoch:
            problems.append(f"it is from epoch {state['epochs_completed']}, the backup's "
                            f"weights from epoch {epoch}")
        saved = state["callbacks"]
        for name, callback in (("early_stopping", self.early_stopping),
                               ("reduce_lr_on_plateau", self.reduce_lr),
                               ("model_checkpoint", self.checkpoint)):
            if saved[name]["monitor"] != callback.monitor:
                problems.append(f"{name} monitored {saved[name]['monitor']!r}, now "
                                f"{callback.monitor!r}")
        for problem in problems:
            log.warning("resume: not restoring the saved callback state: %s", problem)
        return not problems

    def _restore(self, state: dict[str, Any], best: list[Any] | None) -> None:
        saved = state["callbacks"]
        es, rlr, ckpt = self.early_stopping, self.reduce_lr, self.checkpoint
        s = saved["early_stopping"]
        es.wait, es.best, es.best_epoch = s["wait"], s["best"], s["best_epoch"]
        es.stopped_epoch = s["stopped_epoch"]
        es.best_weights = best
        self._best_saved = best
        s = saved["reduce_lr_on_plateau"]
        rlr.wait, rlr.best, rlr.cooldown_counter = s["wait"], s["best"], s["cooldown_counter"]
        ckpt.best = saved["model_checkpoint"]["best"]
        if saved["learning_rate"] is not None:
            self.model.optimizer.learning_rate = saved["learning_rate"]
        history = state["history"]
        self.epochs = [e - 1 for e in history["epochs"]]
        self.metrics = {k: list(v) for k, v in history["metrics"].items()}

    # --- Keras hooks -------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.epochs, self.metrics, self.restored = [], {}, None
        self._best_saved = None
        self._recover()
        state = self._read_state()
        best = None
        if state is not None and state["callbacks"]["early_stopping"]["best_weights"]:
            best = self._load_best_weights()  # before Keras loads the latest weights
        super().on_train_begin(logs)  # weights, optimizer, epoch (compat: the chief's)
        epoch = int(getattr(self.model, "_initial_epoch", None) or 0)
        strategy = getattr(self.model, "_distribute_strategy", None)
        if strategy is not None and compat.is_multi_worker(strategy):
            state, best = self._broadcast(strategy, state, best)
        if state is None:
            if epoch:
                log.warning("resume: backup at epoch %d has no %s; EarlyStopping, "
                            "ReduceLROnPlateau and ModelCheckpoint start fresh", epoch,
                            STATE_FILE)
            return
        if not self._matches(state, epoch):
            return
        self._restore(state, best)
        self.restored = {"epochs_completed": epoch, "mid_epoch": state["mid_epoch"],
                         **self.describe()}
        if state.get("stop_training") and self.params and self.params.get("epochs"):
            # The signal came after EarlyStopping ended training: finish, train no more.
            log.info("resume: training had already stopped after epoch %d", epoch)
            self.model._initial_epoch = max(epoch, int(self.params["epochs"]))
        where = (f"epoch {epoch + 1} from its start" if state["mid_epoch"] is None else
                 f"epoch {epoch + 1} from its start (the backup was taken after "
                 f"{state['mid_epoch']['batches_done']} of its batches)")
        log.info("resuming at %s", where)
        log.info("%s %s", RESTORED_MARK, json.dumps(self.restored, sort_keys=True))

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.stop_signal is None:
            return
        done = int(batch) + 1  # batch: the last step run (steps_per_execution > 1 too)
        self._commit(self._epoch, {"epoch": self._epoch + 1, "batches_done": done,
                                   "signal": signal.Signals(self.stop_signal).name})
        self._stop(done)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._current_epoch = epoch + 1  # BackupAndRestore's own bookkeeping
        self._last_batch_seen = 0
        self.epochs.append(epoch)
        for key, value in (logs or {}).items():
            self.metrics.setdefault(key, []).append(float(np.asarray(value)))
        stopping = self.stop_signal is not None or self.model.stop_training
        if stopping or time.monotonic() - self._last_commit >= self.min_interval_s:
            self._commit(epoch + 1)
            self._last_commit = time.monotonic()
        if self.stop_signal is not None:
            self._epoch = epoch + 1
            self._stop(0)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_end(logs)
        for leftover in (self._sibling(".new"), self._sibling(".old")):
            shutil.rmtree(leftover, ignore_errors=True)

    def _stop(self, batch: int) -> None:
        name = signal.Signals(self.stop_signal).name
        where = f"after {batch} batches of epoch {self._epoch + 1}" if batch else \
            f"at the end of epoch {self._epoch}"
        log.warning("%s: stopped %s; backup written to %s; a re-run resumes at epoch %d "
                    "from its start; exiting with status %d", name, where, self.path,
                    self._epoch + 1, 128 + self.stop_signal)
        raise Preempted(self.stop_signal, epoch=self._epoch + 1, batch=batch,
                        backup_dir=self.backup_dir)


SIGTERM_GRACE_S = 60.0  # after SIGTERM, the longest wait for the end of a batch


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
            os._exit(143)


@contextlib.contextmanager
def stop_on_sigterm(backup: ResumableBackup, *, enabled: bool = True,
                    grace_s: float = SIGTERM_GRACE_S) -> Iterator[None]:
    """While the block runs, SIGTERM makes ``backup`` stop training at the end of the
    current batch with a backup and ``Preempted`` (exit status 143); if no batch ends
    within ``grace_s`` seconds (a stuck step), the process exits 143 without a backup.

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
