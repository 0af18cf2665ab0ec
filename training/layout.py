"""Where things live: the run directory's files and the store's keys, in one place.

A run directory (``<output_dir>/<run_id>/``), written by ``train`` and read by every
step after it::

    backup/                       BackupAndRestore state for resuming (removed at the end)
    checkpoints/best.keras        the best epoch's model so far
    model/                        what is published as the version, whole:
      config.json                 the effective config, written before training
      model.keras  saved_model/   the trained model (Keras file, serving signature)
      run.json                    when it started, the dataset, strategy and software
      history.json history.csv    epochs and metrics
      data_stats.json             the staged data's statistics and verdict (``validate_data``)
      evaluation.json             champion vs challenger and the decision (``evaluate``)
      report/index.html           the report built from the four JSON files
      tensorboard/                event files
      trained.json                written last: training finished, the model is whole
      MLmodel                     written at publish: the version is an MLflow model

The store (a local directory or ``s3://bucket/prefix``)::

    models/<name>/versions/<version>/<files of model/...>
    models/<name>/versions/<version>/manifest.json     written last: the version exists
    models/<name>/production.json                      the pointer and its history
    serving/<name>/<N>/saved_model.pb ...              production for TF Serving, KServe:
    serving/<name>/serving.json                        N rises with every move of the pointer

A staged dataset lives under ``<staging_dir>/<name>/<version>/`` with
``staging-manifest.json`` beside tensorflow-datasets' own files; a team's snapshot
holds links to its partitions' shards, kept under ``<staging_dir>/<name>/partitions/``
(``data/own_snapshot.py``).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from training.errors import RegistryError, shown

# --- names: a model name, a version id and a run id follow one rule ------------------
# JSON-Schema-safe (the trigger form checks it too): no look-behind, '..' refused.
NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NAME_WORDS = ("1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit, "
              "without '..'")
_NAME_RE = re.compile(NAME_PATTERN)


def as_name(text: str) -> str:
    """``text`` made to follow the name rule, the same text for the same input: other
    characters become '-', '..' becomes '.', and a text cut to 128 characters gets a hash
    of the whole appended, so two long texts never share a name. A valid name is
    returned as it is. (Run ids from Airflow's, and the default model name and run id
    of a ``package.module:function`` model.)"""
    if _NAME_RE.fullmatch(text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text)
    cleaned = re.sub(r"\.{2,}", ".", cleaned).lstrip("-._").rstrip("-.") or "run"
    if len(cleaned) > 128:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        cleaned = f"{cleaned[:119].rstrip('-._')}-{digest}"
    return cleaned


def validate_name(field: str, value: Any) -> str:
    """``value`` if it is a valid model name, version or run id; else RegistryError."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise RegistryError(f"{field} must be {NAME_WORDS}, got {shown(value)}")
    return value


# --- the run directory -------------------------------------------------------------
CONFIG = "config.json"
RUN_CONFIG = "run-config.json"  # beside model/: the run's frozen config (config/frozen.py)
BACKUP_DIR = "backup"
AIRFLOW_RECORDS = "airflow"  # what each DAG task did (training_airflow/records.py)
BEST_CHECKPOINT = ("checkpoints", "best.keras")
MODEL_DIR = "model"
MODEL_FILE = "model.keras"
MLMODEL = "MLmodel"  # written at publish: the version is an MLflow model (tracking/mlmodel.py)
SAVED_MODEL_DIR = "saved_model"
HISTORY_CSV = "history.csv"
RUN = "run.json"
HISTORY = "history.json"
EVALUATION = "evaluation.json"
DATA_STATS = "data_stats.json"
REPORT_DIR = "report"
REPORT_INDEX = "index.html"
TENSORBOARD_DIR = "tensorboard"
TRAINED = "trained.json"
PRODUCED = "produced.json"  # beside model/: what each step wrote in it (produced.py)

# --- the store ---------------------------------------------------------------------
MODELS_PREFIX = "models/"
VERSION_MANIFEST = "manifest.json"
POINTER = "production.json"

# --- staging -----------------------------------------------------------------------
STAGING_MANIFEST = "staging-manifest.json"


def model_dir(run_dir: str | os.PathLike[str]) -> Path:
    """The run's ``model/`` directory: everything a published version holds."""
    return Path(run_dir) / MODEL_DIR


def version_prefix(name: str, version: str) -> str:
    """The store prefix of one version, ending in ``/``."""
    return f"{MODELS_PREFIX}{name}/versions/{version}/"


def versions_prefix(name: str) -> str:
    return f"{MODELS_PREFIX}{name}/versions/"


def pointer_key(name: str) -> str:
    """The key of a model's production pointer."""
    return f"{MODELS_PREFIX}{name}/{POINTER}"


SERVING_PREFIX = "serving/"
SERVING_INDEX = "serving.json"
SAVED_MODEL_PB = "saved_model.pb"


def serving_prefix(name: str, number: int | None = None) -> str:
    """The serving layout's base path of ``name`` (TF Serving's ``model_base_path``), or
    the folder of version ``number`` in it (``training.registry.serving``)."""
    base = f"{SERVING_PREFIX}{name}/"
    return base if number is None else f"{base}{number}/"


def version_key(name: str, version: str, filename: str) -> str:
    """The key of one file of a published version (``filename`` relative to ``model/``)."""
    return version_prefix(name, version) + filename
