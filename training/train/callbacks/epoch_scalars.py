"""TensorBoard's epoch scalars, written without TensorFlow (the JAX backend's log).

Keras's ``TensorBoard`` callback writes through ``tensorflow.summary``, and the
``tensorboard`` package's own writer imports TensorFlow when it is installed; a JAX
training process imports neither. ``EpochScalars`` writes what the run's TensorBoard
log holds under TensorFlow (``train/`` and ``validation/``, tags ``epoch_loss``,
``epoch_accuracy``, ``epoch_learning_rate``..., one step per epoch counted from 0) as
event files: TFRecord frames (length and data, each with its masked CRC-32C) of
``Event`` protocol buffers encoded here by hand (``wall_time`` 1, ``step`` 2,
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


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's CRC: CRC-32C rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One TFRecord frame."""
    length = struct.pack("<Q", len(record))
    return (length + struct.pack("<I", masked_crc(length)) + record
            + struct.pack("<I", masked_crc(record)))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 2:  # length-delimited
        return key + _varint(len(payload)) + payload
    return key + payload


def event(wall_time: float, step: int, *, file_version: str | None = None,
          scalars: dict[str, float] | None = None) -> bytes:
    """An ``Event`` protocol buffer: a file version, or scalars at a step."""
    body = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version is not None:
        body += _field(3, 2, file_version.encode())
    if scalars:
        values = b"".join(
            _field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
            for tag, value in scalars.items())
        body += _field(5, 2, values)
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
