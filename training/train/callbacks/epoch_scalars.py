"""TensorBoard's epoch scalars, written without TensorFlow (the JAX backend's log).

Keras's ``TensorBoard`` callback writes through ``tensorflow.summary``, and the
``tensorboard`` package's own writer imports TensorFlow when it is installed; a JAX
training process imports neither. ``EpochScalars`` writes what the run's TensorBoard
log holds under TensorFlow (``train/`` and ``validation/``, tags ``epoch_loss``,
``epoch_accuracy``, ``epoch_learning_rate``..., one step per epoch counted from 0) as
event files: TFRecord frames (``data.records.frame``) of ``Event`` protocol buffers
encoded here by hand (``data.records.field``) (``wall_time`` 1, ``step`` 2,
``file_version`` 3, ``summary`` 5; ``Summary.Value``: ``tag`` 1, ``simple_value`` 2).
``tensorboard --logdir`` reads them as it reads TensorFlow's.

Example::

    callbacks = [EpochScalars("model/tensorboard")]
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

import keras

from training.data.input.records import field, frame, varint


def event(wall_time: float, step: int, *, file_version: str | None = None,
          scalars: dict[str, float] | None = None) -> bytes:
    """An ``Event`` protocol buffer: a file version, or scalars at a step."""
    body = field(1, 1, struct.pack("<d", wall_time)) + field(2, 0, varint(step))
    if file_version is not None:
        body += field(3, 2, file_version.encode())
    if scalars:
        values = b"".join(
            field(1, 2, field(1, 2, tag.encode()) + field(2, 5, struct.pack("<f", value)))
            for tag, value in scalars.items())
        body += field(5, 2, values)
    return body


class EventFile:
    """One event file in ``directory``, flushed after every write."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = Path(directory) / (
            f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.0")
        with self.path.open("ab") as file:
            file.write(frame(event(now, 0, file_version="brain.Event:2")))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        with self.path.open("ab") as file:
            file.write(frame(event(time.time(), step, scalars=scalars)))


class EpochScalars(keras.callbacks.Callback):
    """Each epoch's logs as TensorBoard scalars, as Keras's ``TensorBoard`` callback
    writes them with ``update_freq="epoch"`` (``val_`` metrics under ``validation/``).

    Args:
        log_dir: the directory that gets ``train/`` and ``validation/``.
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        super().__init__()
        self.log_dir = Path(log_dir)
        self._files: dict[str, EventFile] = {}

    def _file(self, split: str) -> EventFile:
        if split not in self._files:
            self._files[split] = EventFile(self.log_dir / split)
        return self._files[split]

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        train, validation = {}, {}
        for name, value in (logs or {}).items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if name.startswith("val_"):
                validation[f"epoch_{name[4:]}"] = number
            else:
                train[f"epoch_{name}"] = number
        if train:
            self._file("train").write(epoch, train)
        if validation:
            self._file("validation").write(epoch, validation)
