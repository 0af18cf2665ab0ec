"""What a backup keeps that Keras 3's ``BackupAndRestore`` forgets: ``resume_state.json``.

Keras 3's ``BackupAndRestore`` backs up the model's weights, the optimizer's state and
the number of finished epochs; it does not save what the other callbacks have learned.
A restarted ``fit`` therefore forgets that EarlyStopping had waited 2 epochs since its
best value (and that value, and the best weights), that ReduceLROnPlateau had waited 1
and already lowered the learning rate, and which value ModelCheckpoint has to beat.

This module is that state and its file: ``CallbackState`` reads the three callbacks'
attributes and writes them back, ``document`` is the file's content (self-describing
and versioned: ``format`` ``training.resume/state``, ``version`` 1; the callbacks'
attributes verbatim, epoch indices 0-based as Keras keeps them; the learning rate; the
history so far; ``mid_epoch`` for a backup taken by SIGTERM), ``read`` reads it back or
says why not, and ``broadcast`` gives every worker of a multi-worker run the chief's
(non-chief workers write their backups to a temporary directory). When it is saved and
restored, and the directory's other files: ``training.train.callbacks.backup``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np

from training.errors import ConfigError, shown

log = logging.getLogger(__name__)

FORMAT = "training.resume/state"  # stored data: never change it, raise VERSION instead
VERSION = 1
STATE_FILE = "resume_state.json"  # written last into a backup
BEST_WEIGHTS_FILE = "best.weights.h5"
WEIGHTS_FILE = "latest.weights.h5"  # Keras BackupAndRestore's names
METADATA_FILE = "training_metadata.json"
RESTORED_MARK = "resume state restored:"  # the INFO line logged after a restore

DESCRIPTION = (
    "Callback state saved with the Keras BackupAndRestore files of this "
    "directory (training.train.resume). callbacks: the Keras callbacks' attributes "
    "(epoch indices 0-based); epochs_completed: the epoch count in "
    "training_metadata.json; mid_epoch: set when a signal stopped training "
    "inside an epoch (the weights are from that point; a re-run repeats "
    "the epoch from its start); stop_training: a callback (EarlyStopping) "
    "had ended training, so a re-run trains no further epoch."
)


def _float(value: Any) -> float | None:
    return None if value is None else float(np.asarray(value))


class CallbackState:
    """The resumable state of EarlyStopping, ReduceLROnPlateau and ModelCheckpoint."""

    def __init__(self, early_stopping: keras.callbacks.EarlyStopping,
                 reduce_lr: keras.callbacks.ReduceLROnPlateau,
                 checkpoint: keras.callbacks.ModelCheckpoint) -> None:
        for name, value, kind in (("early_stopping", early_stopping, "EarlyStopping"),
                                  ("reduce_lr", reduce_lr, "ReduceLROnPlateau"),
                                  ("checkpoint", checkpoint, "ModelCheckpoint")):
            if not isinstance(value, getattr(keras.callbacks, kind)):
                raise ConfigError(f"{name} must be a keras.callbacks.{kind}, got {shown(value)}")
        self.early_stopping = early_stopping
        self.reduce_lr = reduce_lr
        self.checkpoint = checkpoint

    def describe(self, learning_rate: float | None) -> dict[str, Any]:
        """The callbacks' state now, and the optimizer's learning rate."""
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
            "learning_rate": learning_rate,
        }

    def problems(self, state: dict[str, Any], epoch: int) -> list[str]:
        """Why ``state`` does not belong to these callbacks at the backup's ``epoch``."""
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
        return problems

    def restore(self, saved: dict[str, Any], best_weights: list[Any] | None) -> None:
        """Write ``saved`` (a state's ``callbacks``) back into the callbacks."""
        es, rlr, ckpt = self.early_stopping, self.reduce_lr, self.checkpoint
        s = saved["early_stopping"]
        es.wait, es.best, es.best_epoch = s["wait"], s["best"], s["best_epoch"]
        es.stopped_epoch = s["stopped_epoch"]
        es.best_weights = best_weights
        s = saved["reduce_lr_on_plateau"]
        rlr.wait, rlr.best, rlr.cooldown_counter = s["wait"], s["best"], s["cooldown_counter"]
        ckpt.best = saved["model_checkpoint"]["best"]


def document(*, epochs_completed: int, mid_epoch: dict[str, Any] | None,
             stop_training: bool, callbacks: dict[str, Any], epochs: list[int],
             metrics: dict[str, list[float]]) -> dict[str, Any]:
    """The content of ``resume_state.json`` (``epochs``: 0-based, as History's)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "description": DESCRIPTION,
        "epochs_completed": epochs_completed,
        "mid_epoch": mid_epoch,
        "stop_training": stop_training,
        "callbacks": callbacks,
        "history": {"epochs": [e + 1 for e in epochs], "metrics": metrics},
    }


def read(directory: Path) -> dict[str, Any] | None:
    """The state saved in ``directory``; None (with a warning) when it is unreadable or
    of another format or version, so the callbacks start fresh."""
    path = directory / STATE_FILE
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


def broadcast(send: Callable[[list[Any]], list[Any]], state: dict[str, Any] | None,
              best: list[Any] | None, weights_like: Callable[[], list[Any]]
              ) -> tuple[dict[str, Any] | None, list[Any] | None]:
    """Every worker gets the chief's state and best weights (two or three collectives,
    run by every worker in step). ``send``: the broadcast from the chief
    (``tensorflow_sender``); ``weights_like()``: arrays shaped as the
    best weights, for a worker that has none."""
    blob = json.dumps(state).encode() if state is not None else b""
    (size,) = send([np.int64(len(blob))])
    size = int(size)
    if size == 0:
        return None, None
    mine = np.zeros(size, np.int32)
    mine[:min(size, len(blob))] = np.frombuffer(blob, np.uint8)[:size]
    (chars,) = send([mine])
    state = json.loads(bytes(np.asarray(chars, np.uint8)).decode())
    if state["callbacks"]["early_stopping"]["best_weights"] is None:
        return state, None
    best = best if best is not None else [np.zeros_like(w) for w in weights_like()]
    synced = send(best)
    return state, [np.asarray(w) for w in synced]


def tensorflow_sender(strategy: Any) -> Callable[[list[Any]], list[Any]]:
    """Broadcast from replica 0 of a MultiWorkerMirroredStrategy (one all-reduce)."""
    from training.train.keras_patches.backup_restore_sync import broadcast_from_replica_0

    return lambda values: broadcast_from_replica_0(strategy, values)
