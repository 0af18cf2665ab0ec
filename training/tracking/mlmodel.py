"""The ``MLmodel`` file that makes a published version an MLflow model where it lies.

MLflow loads a model from a folder with an ``MLmodel`` file (YAML: the flavors that can
load it). Written beside ``model.keras`` in the run's ``model/`` at publish, it makes
the version folder in the store itself an MLflow model, so the registry's mirror
(``mirror.py``) registers that folder as the model version's source and the bytes are
stored once: ``mlflow.pyfunc.load_model``, ``mlflow models serve`` and anything that
reads MLflow models load ``models/<name>/versions/<version>/`` directly.

Flavors: ``keras`` (``data: model``: MLflow's Keras loader opens ``model.keras``) and
``python_function`` through ``mlflow.keras`` (no ``data``: the loader is handed the
folder). Written here with PyYAML, without importing MLflow: the file is the same with
tracking off, and the same on a retry (no clock: the run's start time).
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from training import layout

MLFLOW_VERSION = "3.17.2"  # the lock's; MLmodel's format is stable across 3.x


def mlmodel(*, run_id: str, created: str, backend: str) -> dict[str, Any]:
    """The ``MLmodel`` document of a version (``created``: the run's start, ISO 8601).
    Nothing in it depends on the machine that writes it, beyond the lock's Keras and
    Python 3.11, so a publish retried elsewhere writes the same bytes."""
    return {
        "artifact_path": None,
        "flavors": {
            "keras": {"data": layout.MODEL_FILE.removesuffix(".keras"),
                      "keras_version": version("keras"), "keras_backend": backend,
                      "save_exported_model": False},
            "python_function": {"loader_module": "mlflow.keras",
                                "python_version": "{}.{}".format(*sys.version_info)},
        },
        "mlflow_version": MLFLOW_VERSION,
        "model_uuid": hashlib.sha256(run_id.encode()).hexdigest()[:32],
        "utc_time_created": created,
    }


def write_mlmodel(model_dir: str | os.PathLike[str], *, run_id: str, created: str,
                  backend: str) -> Path:
    """Write ``MLmodel`` into ``model_dir`` (replaced atomically); its path."""
    path = Path(model_dir) / layout.MLMODEL
    tmp = path.with_name(f".{layout.MLMODEL}.tmp")
    tmp.write_text(yaml.safe_dump(mlmodel(run_id=run_id, created=created, backend=backend),
                                  sort_keys=True))
    os.replace(tmp, path)
    return path
