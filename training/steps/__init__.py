"""The pipeline's six steps, one module each, in the order a run takes them::

    stage -> validate -> train -> evaluate -> publish -> promote

Each module owns its step: what it takes (what the step before returned), what it
returns (small dicts and paths, never models, so they travel through XCom), and its
own "already done for this run?" rule, so a retried or re-run step completes the run
instead of doing it twice. ``python -m training run`` calls them in this order
(``training/cli.py``); each Airflow operator (``plugins/training_airflow/tasks.py``)
makes one call into its module. No module here imports TensorFlow at the top: what
needs it imports it inside the function that does.
"""

from __future__ import annotations

import os
from pathlib import Path

from training.config import RunConfig

ORDER = ("stage", "validate", "train", "evaluate", "publish", "promote")


def run_dir_of(cfg: RunConfig, handed: str | os.PathLike[str] | None) -> Path:
    """The run directory a step works on: the one the step before reported (Airflow
    passes ``train``'s), or, without one, the config's own (the CLI)."""
    return Path(handed) if handed is not None else cfg.run_dir()
