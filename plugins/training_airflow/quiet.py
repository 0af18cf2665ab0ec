"""TensorFlow's CUDA probing noise, kept out of the task logs of a CPU-only worker.

A TensorFlow built with CUDA support writes, on a machine without a GPU driver, lines
such as ``cudart_stub.cc:31] Could not find cuda drivers on your machine`` and
``cuda_platform.cc:52] failed call to cuInit`` straight to file descriptor 2, some of
them before its logging is initialised (so ``TF_CPP_MIN_LOG_LEVEL`` cannot hide them).
Airflow 3 logs everything a task process writes to stderr as ERROR, so a healthy CPU
run showed five ERROR lines per task.

- ``is_noise(line)``: whether a line is that probing noise and nothing else;
- ``stderr_without_noise()``: a context that routes descriptor 2 of this process
  through a filter thread for its duration, dropping the noise and passing every
  other byte on (real TensorFlow errors included).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|cuda_(dnn|fft|blas)\.cc:\d+\] Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation_placer\.cc:\d+\] computation placer already registered"
)


def is_noise(line: str) -> bool:
    return NOISE.search(line) is not None


@contextlib.contextmanager
def stderr_without_noise() -> Iterator[None]:
    """Drop TensorFlow's CUDA probing lines from this process's descriptor 2."""
    sys.stderr.flush()
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    sink = os.dup(original)  # the pump's own: closed by the pump, never reused under it

    def pump() -> None:
        try:
            with os.fdopen(read_end, "rb") as lines:
                for raw in lines:  # keep draining, even if writing fails
                    if not is_noise(raw.decode(errors="replace")):
                        with contextlib.suppress(OSError):
                            os.write(sink, raw)
        finally:
            os.close(sink)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last write end: the pump sees EOF
        thread.join(timeout=5)
        os.close(original)
