"""TensorFlow's CUDA probing noise, kept out of the task logs of a CPU-only worker.

A TensorFlow built with CUDA support writes, on a machine without a GPU driver, lines
such as ``cudart_stub.cc:31] Could not find cuda drivers on your machine`` and
``cuda_platform.cc:52] failed call to cuInit`` straight to file descriptor 2, some of
them before its logging is initialised (so ``TF_CPP_MIN_LOG_LEVEL`` cannot hide them).
Airflow 3 logs everything a task process writes to stderr as ERROR, so a healthy CPU
run showed five ERROR lines per task.

- ``is_noise(line)``: whether a line is that probing noise and nothing else. Task
  processes load no TensorFlow (``tasks.py``); its child processes' output reaches the
  task log through ``launchers.run_child``, which drops these lines and passes every
  other one on (real TensorFlow errors included).
"""

from __future__ import annotations

import re

NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|cuda_(dnn|fft|blas)\.cc:\d+\] Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation_placer\.cc:\d+\] computation placer already registered"
)


def is_noise(line: str) -> bool:
    return NOISE.search(line) is not None
