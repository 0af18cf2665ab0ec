"""A trial's own run: the base config with the searched fields replaced, its own run id
and run directory, and the sweep off.

The trial's run id is ``<base run id>-t<N>`` (N: the slot), so a retried trial task lands
in the same directory and resumes from its backup. Its config has the sweep section
reset to its defaults (the storage, a deployment setting, stays): the trial is one
ordinary run, its config.json says what it trained, its model fingerprint is the one a
plain run with these values would have, and nothing started from its config sweeps again.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.config.run import flat_fields
from training.config.sweep import SweepConfig
from training.errors import ConfigError

MAX_NAME = 128  # training.layout.NAME_PATTERN
ARGS = "model.args."


def trial_run_id(cfg: Any, number: int) -> str:
    """``<base run id>-t<number>``; a base id too long for the suffix is cut and given
    a hash of the whole, so two long ids never share a trial's directory."""
    base, suffix = cfg.run_id, f"-t{number}"
    if len(base) + len(suffix) <= MAX_NAME:
        return base + suffix
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    return f"{base[:MAX_NAME - len(suffix) - 9].rstrip('-._')}-{digest}{suffix}"


def trial_run_dir(cfg: Any, number: int) -> Path:
    return Path(cfg.storage.output_dir) / trial_run_id(cfg, number)


def overrides(cfg: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` (``section.field`` or ``model.args.<name>`` -> value) as the flat keys
    ``RunConfig.with_overrides`` takes; model arguments merged into ``model_args``."""
    keys = {s.path: s.key for s in flat_fields()}
    flat: dict[str, Any] = {}
    args = dict(cfg.model.args)
    for path, value in params.items():
        if path.startswith(ARGS):
            args[path.removeprefix(ARGS)] = value
        elif path in keys:
            flat[keys[path]] = value
        else:
            raise ConfigError(f"sweep: {path!r} is not a field of the config")
    if args != cfg.model.args:
        flat["model_args"] = args
    return flat


def trial_config(cfg: Any, number: int, params: Mapping[str, Any]) -> Any:
    """Trial ``number``'s config: ``cfg`` with ``params`` replaced, its own run id, the
    sweep off (module doc). Checked as every config is."""
    base = cfg
    if any(f.name == "sweep" for f in dataclasses.fields(cfg)):
        base = dataclasses.replace(cfg, sweep=SweepConfig(storage=cfg.sweep.storage))
    return base.with_overrides({**overrides(cfg, params),
                                "run_id": trial_run_id(cfg, number)})
