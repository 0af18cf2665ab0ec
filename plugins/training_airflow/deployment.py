"""The deployment's paths, store and limits, from the worker's environment.

Here, apart from ``params.py`` (which imports Airflow's ``Param``), so that what reads
a run back without Airflow (``summary.py``) finds the same directories the tasks used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.errors import ConfigError


def deployment_settings(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The deployment's paths, store and limits, from the environment (module doc)."""
    home = Path(env.get("AIRFLOW_HOME", Path.home() / "airflow"))
    data = Path(env.get("TRAINING_DATA_DIR", home / "training"))
    settings: dict[str, Any] = {
        "staging_dir": env.get("TRAINING_STAGING_DIR", os.fspath(data / "datasets")),
        "output_dir": env.get("TRAINING_OUTPUT_DIR", os.fspath(data / "runs")),
        "store_uri": env.get("TRAINING_STORE_URI", os.fspath(data / "store")),
    }
    if env.get("TRAINING_MAX_VERSION_MB"):
        try:
            settings["max_version_mb"] = int(env["TRAINING_MAX_VERSION_MB"])
        except ValueError:
            raise ConfigError("TRAINING_MAX_VERSION_MB must be a whole number of MiB, got "
                              f"{env['TRAINING_MAX_VERSION_MB']!r}") from None
    return settings
