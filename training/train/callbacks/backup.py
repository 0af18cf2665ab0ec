"""``ResumableBackup``: BackupAndRestore that also keeps the other callbacks' state.

What it keeps beyond Keras's weights, optimizer and epoch (EarlyStopping's,
ReduceLROnPlateau's and ModelCheckpoint's state, the learning rate, the history) and
the file that holds it: ``training.train.resume``. SIGTERM: ``training.train.preemption``.

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
  the ``backup_restore_sync`` patch of ``training.train.keras_patches`` broadcasts the chief's) and
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
Each backup is written whole into ``<backup_dir>.new/``, then swapped in by
``training.files.swap_dir`` (fsync, two renames); ``on_train_begin`` finishes a swap that
a crash interrupted. So weights, ``training_metadata.json`` (Keras's file: the epoch to
resume at) and our state always belong to the same moment. The directory holds
``latest.weights.h5`` and ``training_metadata.json`` (Keras's files),
``best.weights.h5`` (EarlyStopping's best weights, a Keras weights file: written from
the model in the epoch that EarlyStopping took them, copied forward from the previous
backup otherwise) and ``resume_state.json``, written last.

The directory is kept when training ends; ``fit.train`` removes it once the model is
saved, so a crash while saving still resumes from the last epoch.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np

from training import files
from training.errors import ConfigError, Preempted, shown
from training.train import keras_patches, resume
from training.train.resume import BEST_WEIGHTS_FILE, METADATA_FILE, STATE_FILE, WEIGHTS_FILE

log = logging.getLogger(__name__)


class ResumableBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore that also saves and restores the other callbacks' state.

    Place it after ``early_stopping``, ``reduce_lr`` and ``checkpoint`` in the callback
    list (see the module docstring for why). ``epochs`` and ``metrics`` hold the whole
    run's history, epochs before a restart included. Epoch-end backups are written at
    most every ``min_interval_s`` seconds (short epochs would spend more time backing up
    than training); a stop (SIGTERM, EarlyStopping) always writes one.
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike,
        *,
        early_stopping: keras.callbacks.EarlyStopping,
        reduce_lr: keras.callbacks.ReduceLROnPlateau,
        checkpoint: keras.callbacks.ModelCheckpoint,
        min_interval_s: float = 0.0,
        restore_from: str | os.PathLike | None = None,
    ) -> None:
        if not isinstance(backup_dir, str | os.PathLike) or not os.fspath(backup_dir):
            raise ConfigError(f"backup_dir must be a directory path, got {shown(backup_dir)}")
        if isinstance(min_interval_s, bool) or not isinstance(min_interval_s, int | float) \
                or not min_interval_s >= 0:
            raise ConfigError(f"min_interval_s must be a number of seconds >= 0, got "
                              f"{shown(min_interval_s)}")
        # Kept until the caller has saved the model (fit.train removes it then): a crash
        # while saving must not lose the finished training.
        super().__init__(backup_dir=os.fspath(backup_dir), delete_checkpoint=False)
        self.watched = resume.CallbackState(early_stopping, reduce_lr, checkpoint)
        self.early_stopping = early_stopping
        self.epochs: list[int] = []  # 0-based, as History.epoch
        self.metrics: dict[str, list[float]] = {}
        self.restored: dict[str, Any] | None = None  # describe() right after a restore
        self.stop_signal: int | None = None  # set by preemption.stop_on_sigterm
        self._epoch = 0  # index of the epoch in progress
        self._stop_pending = False  # the epoch ended after a stop signal (on_epoch_end)
        self._best_saved: Any = None  # the best_weights object best.weights.h5 holds
        self.min_interval_s = min_interval_s
        self._last_commit = time.monotonic()
        # Where a restore reads: this backup, or the chief's for a worker of a JAX run
        # of several processes (every process must load the same state, in step).
        self.restore_from = Path(restore_from) if restore_from else None

    @property
    def path(self) -> Path:
        return Path(self.backup_dir)

    def describe(self) -> dict[str, Any]:
        """The resumable state of the callbacks now (what a backup saves)."""
        optimizer = getattr(self.model, "optimizer", None)
        rate = None if optimizer is None else float(
            keras.ops.convert_to_numpy(optimizer.learning_rate))
        return self.watched.describe(rate)

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
        new = files.pending_dir(self.path)
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(parents=True)
        self.model.save_weights(os.fspath(new / WEIGHTS_FILE))
        batch = mid_epoch["batches_done"] if mid_epoch else 0
        (new / METADATA_FILE).write_text(json.dumps({"epoch": epochs_completed,
                                                     "batch": batch}))
        self._write_best_weights(new)
        state = resume.document(
            epochs_completed=epochs_completed, mid_epoch=mid_epoch,
            stop_training=bool(getattr(self.model, "stop_training", False)),
            callbacks=self.describe(), epochs=self.epochs, metrics=self.metrics)
        (new / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")  # last
        files.swap_dir(self.path)

    # --- restoring ---------------------------------------------------------------------
    def _load_best_weights(self) -> list[Any]:
        """EarlyStopping's best weights from the backup, through the model (whose
        weights ``BackupAndRestore`` loads right after)."""
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        self.model.load_weights(os.fspath(Path(self.backup_dir) / BEST_WEIGHTS_FILE))
        return self.model.get_weights()

    def _restore(self, state: dict[str, Any], best: list[Any] | None) -> None:
        saved = state["callbacks"]
        self.watched.restore(saved, best)
        self._best_saved = best
        if saved["learning_rate"] is not None:
            self.model.optimizer.learning_rate = saved["learning_rate"]
        history = state["history"]
        self.epochs = [e - 1 for e in history["epochs"]]
        self.metrics = {k: list(v) for k, v in history["metrics"].items()}

    # --- Keras hooks -------------------------------------------------------------------
    def _reading(self, directory: Path) -> None:
        """Point Keras's own paths at ``directory`` (restore) or back at ``path``."""
        self.backup_dir = os.fspath(directory)
        self._weights_path = os.fspath(directory / WEIGHTS_FILE)
        self._training_metadata_path = os.fspath(directory / METADATA_FILE)
        self._prev_weights_path = f"{self._weights_path}.bkp"
        self._prev_training_metadata_path = f"{self._training_metadata_path}.bkp"

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.epochs, self.metrics, self.restored = [], {}, None
        self._stop_pending = False
        self._best_saved = None
        own = self.path
        files.finish_dir_swap(own, last_file=STATE_FILE)
        source = self.restore_from or own
        self._reading(source)
        try:
            state = resume.read(source)
            best = None
            if state is not None and state["callbacks"]["early_stopping"]["best_weights"]:
                best = self._load_best_weights()  # before Keras loads the latest weights
            super().on_train_begin(logs)  # weights, optimizer, epoch (keras_patches: the chief's)
        finally:
            self._reading(own)
        epoch = int(getattr(self.model, "_initial_epoch", None) or 0)
        strategy = getattr(self.model, "_distribute_strategy", None)
        if strategy is not None and keras_patches.is_multi_worker(strategy):
            state, best = resume.broadcast(resume.tensorflow_sender(strategy), state, best,
                                           self.model.get_weights)
        if state is None:
            if epoch:
                log.warning("resume: backup at epoch %d has no %s; EarlyStopping, "
                            "ReduceLROnPlateau and ModelCheckpoint start fresh", epoch,
                            STATE_FILE)
            return
        problems = self.watched.problems(state, epoch)
        for problem in problems:
            log.warning("resume: not restoring the saved callback state: %s", problem)
        if problems:
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
        log.info("%s %s", resume.RESTORED_MARK, json.dumps(self.restored, sort_keys=True))

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._stop_if_pending()
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
            # Stopped at the next hook, not here: the callbacks after this one see the
            # epoch end first (a sweep's pruning report, the epoch's tracking), or a
            # resumed run, which starts after this epoch, would never give them it.
            self._epoch = epoch + 1
            self._stop_pending = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_end(logs)
        files.finish_dir_swap(self.path, last_file=STATE_FILE)  # no leftovers
        self._stop_if_pending()  # a signal in the last epoch's validation

    def _stop_if_pending(self) -> None:
        if self._stop_pending:
            self._stop_pending = False
            self._stop(0)

    def _stop(self, batch: int) -> None:
        name = signal.Signals(self.stop_signal).name
        where = f"after {batch} batches of epoch {self._epoch + 1}" if batch else \
            f"at the end of epoch {self._epoch}"
        log.warning("%s: stopped %s; backup written to %s; a re-run resumes at epoch %d "
                    "from its start; exiting with status %d", name, where, self.path,
                    self._epoch + 1, 128 + self.stop_signal)
        raise Preempted(self.stop_signal, epoch=self._epoch + 1, batch=batch,
                        backup_dir=self.backup_dir)
