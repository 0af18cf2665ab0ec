"""``Throughput``: how fast each epoch trained and how much memory the run held.

Platform teams ask first how fast a run went and how much device memory it used. Each
epoch's logs get, before any other callback reads them (it is first in the list, so the
CSV log, TensorBoard, the backup and ``history.json`` carry them):

* ``images_per_s``: training images over the training part of the epoch, timed apart
  from its validation (from the epoch's start to the validation's, or to its end);
* ``step_ms``: that time over the epoch's steps;
* ``peak_memory_mb``: the peak so far of the accelerator's memory (JAX's
  ``peak_bytes_in_use`` on a GPU or TPU, TensorFlow's ``get_memory_info`` peak on a GPU),
  else the process's peak resident memory (a CPU run), as ``memory_source`` says.

Example::

    callbacks = [Throughput(images_per_epoch=1258, batch_size=64), ...]
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import keras

MEASURED = ("images_per_s", "step_ms", "peak_memory_mb")  # what each epoch's logs get


def peak_memory() -> tuple[float, str]:
    """(MiB, what was measured): the accelerator's peak, or the process's peak RSS."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in
                 jax.local_devices()]
        if any(peaks):
            return max(p or 0 for p in peaks) / 2**20, f"{jax.default_backend()} device"
    elif backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_logical_devices("GPU"):
            return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20, "gpu"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, B on macOS
    return rss / (2**20 if sys.platform == "darwin" else 2**10), "process RSS"


class Throughput(keras.callbacks.Callback):
    """Each epoch's training images per second, step time and peak memory, in its logs.

    Args:
        images_per_epoch: the training images one epoch trains on; None: the epoch's
            steps times ``batch_size`` (a split whose size its reader does not say).
        batch_size: the global batch.
    """

    def __init__(self, images_per_epoch: int | None, batch_size: int) -> None:
        super().__init__()
        for name, value in (("images_per_epoch", images_per_epoch),
                            ("batch_size", batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.images_per_epoch, self.batch_size = images_per_epoch, batch_size
        self.memory_source = ""
        self.clock = time.perf_counter  # seconds; the tests give it a clock of their own
        self._started = self._trained = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._started, self._trained = self.clock(), None

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._started is not None and self._trained is None:  # fit's validation
            self._trained = self.clock() - self._started

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None or self._started is None:
            return
        seconds = self._trained or (self.clock() - self._started)
        steps = (self.params or {}).get("steps") or 1
        images = self.images_per_epoch or steps * self.batch_size
        logs["images_per_s"] = images / seconds
        logs["step_ms"] = 1000 * seconds / steps
        logs["peak_memory_mb"], self.memory_source = peak_memory()
        self._started = None


def summary(metrics: dict[str, list[float]], memory_source: str,
          accelerator: dict[str, Any] | None) -> dict[str, Any]:
    """``run.json``'s ``throughput``: the median epoch's training images per second and
    step time (every epoch of the run, a restart's included), the peak memory and what
    was measured, and the accelerator."""
    def median(values: list[float]) -> float | None:
        ordered = sorted(values)
        return ordered[len(ordered) // 2] if ordered else None

    peaks = metrics.get("peak_memory_mb") or []
    return {"images_per_s": median(metrics.get("images_per_s") or []),
            "step_ms": median(metrics.get("step_ms") or []),
            "peak_memory_mb": max(peaks) if peaks else None,
            "memory_measured": memory_source or None, "accelerator": accelerator}
