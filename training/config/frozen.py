"""A run's config, frozen: built and checked once, at the run's first task, then handed on.

The run's first task (Airflow's ``stage_dataset``) builds the config from the form and
the deployment, and ``freeze`` writes it into the run directory (``run-config.json``,
atomically) and returns its path and SHA-256, which the task hands on through XCom.
Every later task ``thaw``s that file instead of building the config again from the
form and its own worker's environment, so a run's settings are fixed when it starts,
and the training process is started with the same file (``--config``).

The digest is the guard: a file that changed after the first task wrote it is refused,
naming both digests. Each process checks a frozen config at most once: one that froze
or thawed these bytes before reuses the config it built (the tasks of one
``airflow dags test`` share a process).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.config.run import RunConfig
from training.errors import ConfigError
from training.files import fsync_path, sha256_bytes
from training.layout import RUN_CONFIG

_BUILT: dict[str, RunConfig] = {}  # SHA-256 of a frozen file -> the config it holds


def freeze(cfg: RunConfig) -> dict[str, str]:
    """Write ``cfg`` as the run's frozen config; returns ``{"path", "sha256"}``."""
    data = cfg.to_json().encode()
    path = cfg.run_dir() / RUN_CONFIG
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{RUN_CONFIG}.{os.getpid()}")
    partial.write_bytes(data)
    fsync_path(partial)
    partial.replace(path)
    digest = sha256_bytes(data)
    _BUILT[digest] = cfg
    return {"path": os.fspath(path), "sha256": digest}


def thaw(frozen: Mapping[str, Any]) -> RunConfig:
    """The config ``freeze`` wrote, read back from ``frozen["path"]``; ConfigError if the
    file is gone or its bytes are not the ones written (``frozen["sha256"]``)."""
    if not isinstance(frozen, Mapping) or not {"path", "sha256"} <= set(frozen):
        raise ConfigError(f"the run's frozen config handed on is {frozen!r}, not its path "
                          "and SHA-256 ({'path': ..., 'sha256': ...}): run the run again "
                          "from its first task")
    path, written = Path(frozen["path"]), frozen["sha256"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"the run's frozen config {path} cannot be read ({exc.strerror}): "
                          "its first task wrote it; run the run again from its first "
                          "task") from None
    digest = sha256_bytes(data)
    if digest != written:
        raise ConfigError(
            f"the run's frozen config {path} changed after the run's first task wrote it "
            f"(SHA-256 {digest[:16]}, written as {written[:16]}): a run's settings are "
            "fixed when it starts; trigger a new run to change them")
    if digest not in _BUILT:
        _BUILT[digest] = RunConfig.from_json(data.decode("utf-8"))
    return _BUILT[digest]
