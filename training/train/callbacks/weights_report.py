"""``WeightsReport``: a worker's final weights digest and per-epoch logs.

Under MultiWorkerMirroredStrategy every worker applies the same all-reduced update, so
every worker must end with the same weights. Each worker of a local multi-worker run
(``training.launch.worker``) trains with this callback; at the end of training it holds
``digest`` (``weights_digest`` of the model) and ``epochs`` (this process's per-epoch
logs: the model's metrics, which every worker shares; its own speed and memory, which
differ by worker, are left out: ``throughput.MEASURED``), and writes both to ``path``
when one is given. The launcher compares the digests of all workers.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import keras
import numpy as np

from training.errors import ConfigError, shown
from training.train.callbacks.throughput import MEASURED


def weights_digest(model: Any) -> str:
    """SHA-256 over a Keras model's weights (dtype, shape and bytes of each, in order)."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        array = np.ascontiguousarray(weight)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class WeightsReport(keras.callbacks.Callback):
    """Records each epoch's logs and, at the end of training, the weights digest.

    path: where to write ``{"index", "digest", "epochs"}`` as JSON at the end (None:
    nowhere). index: the worker's task index, recorded in the file.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, index: int = 0) -> None:
        super().__init__()
        if path is not None and (not isinstance(path, str | os.PathLike)
                                 or not os.fspath(path)):
            raise ConfigError(f"path must be a file path or None, got {shown(path)}")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigError(f"index must be a worker index >= 0, got {shown(index)}")
        self.path = None if path is None else Path(path)
        self.index = index
        self.epochs: list[dict[str, float]] = []
        self.digest: str | None = None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epochs.append({"epoch": epoch + 1,
                            **{k: float(v) for k, v in (logs or {}).items()
                               if k not in MEASURED}})

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.digest = weights_digest(self.model)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"index": self.index, "digest": self.digest,
                                             "epochs": self.epochs}, indent=2) + "\n")
