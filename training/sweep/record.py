"""``sweep.json``: what a sweep tried and what it picked, beside the base run.

One entry per trial (by slot): its values, its state (complete, pruned, failed, skipped:
not started within ``sweep.timeout_minutes``), the objective after each epoch, how long
it ran, its run id and run directory (a path on the machine that trained it: the report
shows the run id) and why it failed; then the best trial, the counts, the space searched
(how the report draws each field: a log-scaled range on a log axis, choices by
category), and where the study lives (never with a password), so a person can open it
in Optuna's tools.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.files import replace_file

SWEEP_JSON = "sweep.json"
FINISHED = ("complete", "pruned", "failed", "skipped")


@dataclass(frozen=True)
class TrialRecord:
    """One slot's trial as the study holds it (``training.sweep.study.records``)."""

    number: int  # the slot: trial task N, run id <base>-tN
    optuna_number: int | None  # the Optuna trial (a new one per attempt after a failure)
    attempt: int
    params: dict[str, Any]
    state: str  # complete, pruned, failed, skipped; waiting or running before the close
    value: float | None  # the objective told (complete) or the last reported (pruned)
    epochs: dict[int, float]  # epochs done -> the objective then
    duration_s: float | None
    run_dir: str
    error: str = ""
    data_fingerprint: str = ""
    continued_from: str = ""  # the earlier trial whose values it ran (sweep.continue)
    run_id: str = ""  # <base run id>-tN, the last part of run_dir


def counts(trials: Sequence[TrialRecord]) -> dict[str, int]:
    """``{"trials": N, "complete": c, "pruned": k, "failed": f, "skipped": s}``; a trial
    still waiting or running counts as failed (it did not finish)."""
    out = {"trials": len(trials), **dict.fromkeys(FINISHED, 0)}
    for t in trials:
        out[t.state if t.state in FINISHED else "failed"] += 1
    return out


def sweep_document(trials: Sequence[TrialRecord], best: TrialRecord | None, *,
                   storage: str, study: str, objective: str, direction: str,
                   space: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The content of ``sweep.json``; ``space``: ``sweep.space`` as an object."""
    return {
        "objective": {"monitor": objective, "direction": direction},
        "study": {"storage": storage, "name": study},
        "space": dict(space or {}),
        "counts": counts(trials),
        "best": None if best is None else {"number": best.number, "value": best.value,
                                           "params": best.params, "run_id": best.run_id,
                                           "run_dir": best.run_dir},
        "trials": [{**asdict(t), "epochs": {str(k): v for k, v in t.epochs.items()}}
                   for t in trials],
    }


def write_sweep_json(directory: str | os.PathLike[str], trials: Sequence[TrialRecord],
                     best: TrialRecord | None, *, storage: str, study: str,
                     objective: str, direction: str,
                     space: Mapping[str, Any] | None = None) -> Path:
    """Write ``sweep.json`` into ``directory`` (the base run's), whole or not at all.
    ``storage`` is the shown one (``Sweep.shown``): this file never holds a password."""
    path = Path(directory) / SWEEP_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = sweep_document(trials, best, storage=storage, study=study, objective=objective,
                         direction=direction, space=space)
    replace_file(path, [(json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()])
    return path
