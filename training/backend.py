"""The Keras backend of a process: chosen once, before anything imports Keras.

Keras reads ``KERAS_BACKEND`` when it is first imported and keeps that backend for the
life of the process (``keras.backend.backend()``). So the backend is a property of a
process, not of a call: every launcher sets ``KERAS_BACKEND`` in the environment of the
training process it starts (``env``), and that process calls ``use`` with the run's
``runtime.backend`` before it imports Keras. A process whose Keras is already imported
with the other backend refuses in one line naming both, instead of training on the
wrong one.

``tensorflow`` is everything else too: staging (tensorflow-datasets), the SavedModel
export for serving, publishing. A ``jax`` training process imports no TensorFlow
(docs/backends.md), and ``use("jax")`` makes that a rule rather than a hope: Keras
itself imports TensorFlow wherever it is installed (``keras.utils.set_random_seed``
seeds it, saving checks its types, through ``keras.src.utils.module_utils``), so the
process's imports of ``tensorflow`` and ``tensorflow_datasets`` fail from then on, as
if they were not installed; Keras then leaves them alone, and code of ours that would
reach for them fails at once, naming this module.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any

from training.errors import ConfigError

ENV = "KERAS_BACKEND"
BACKENDS = ("tensorflow", "jax")


def imported() -> str | None:
    """The backend this process's Keras was imported with; None before Keras is."""
    if "keras" not in sys.modules:
        return None
    import keras

    return keras.backend.backend()


NOT_IN_JAX = ("tensorflow", "tensorflow_datasets")


class NoTensorFlow(importlib.abc.MetaPathFinder):
    """An import finder that refuses TensorFlow's packages (``sys.meta_path``)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] in NOT_IN_JAX:
            raise ModuleNotFoundError(
                f"No module named {name!r} in this process: it trains on Keras's JAX "
                "backend, which imports no TensorFlow (training.backend)", name=name)
        return None


def chosen() -> str:
    """The backend this process runs or will run Keras on: the imported one, else
    ``KERAS_BACKEND`` (Keras's default, tensorflow, when unset)."""
    return imported() or os.environ.get(ENV) or "tensorflow"


def use(name: str) -> None:
    """Make ``name`` this process's Keras backend: set before Keras is imported, or
    ConfigError when Keras already runs on another."""
    if name not in BACKENDS:
        raise ConfigError(f"runtime.backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    current = imported()
    if current is None:
        os.environ[ENV] = name
    elif current != name:
        raise ConfigError(
            f"runtime.backend is {name!r}, but this process's Keras was already imported "
            f"with backend {current!r} (KERAS_BACKEND={os.environ.get(ENV, '')!r}): a "
            "process has one backend; start a new process with KERAS_BACKEND set")
    if name == "jax" and not any(isinstance(f, NoTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, NoTensorFlow())


def env(name: str) -> dict[str, str]:
    """What a launcher adds to the environment of a training process of backend
    ``name``."""
    return {ENV: name}


def child_env(name: str) -> dict[str, str]:
    """This process's environment for a child process of backend ``name``."""
    return {**os.environ, ENV: name}
