"""The report's Sweep section: what a version's ``sweep.json`` says, as text and rows.

A version picked by a hyperparameter sweep carries ``sweep.json`` (written by
``training.sweep.record``) among its files. This module reads that document leniently
(a field it lacks leaves a dash, never an error: the report must build from any
version's files) into what the section shows: the line "best of N trials (k pruned,
f failed)", the objective, the best trial's values and run id (never its run directory:
a path on the machine that trained it, kept in ``sweep.json``), the space searched, the
study, and one row per trial.
The Models page shows the same line beside the version, so ``trials_line`` is its one
wording. The plots are ``sweep_plots``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from training.config.sections import monitor_rises

__all__ = ["SWEEP_ANCHOR", "Trial", "best_number", "duration_text", "maximized", "run_id_of",
           "searched", "space_text", "sweep_section", "trials", "trials_line", "value_text"]

# The section's id in index.html: the Models page links the version's line to it.
SWEEP_ANCHOR = "sweep"


@dataclass(frozen=True)
class Trial:
    """One trial of ``sweep.json``, its fields checked for what the report needs."""

    number: int
    state: str
    value: float | None  # None: no objective (failed, skipped, or not a number)
    epochs: tuple[tuple[int, float], ...]  # (epochs done, the objective then), in order
    params: dict[str, Any]
    duration_s: float | None
    error: str
    continued_from: str
    run_id: str


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _real(value: Any) -> float | None:
    """A finite number as a float; None for anything else (booleans included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def trials_line(counts: Any) -> str | None:
    """"best of N trials (k pruned, f failed)", with ", s skipped" when a trial was not
    started within the sweep's budget; "no trial of N completed (...)" when none did.
    None when ``counts`` is not ``sweep.json``'s counts."""
    if not isinstance(counts, Mapping):
        return None
    total, pruned, failed = (_count(counts.get(k)) for k in ("trials", "pruned", "failed"))
    if total is None or pruned is None or failed is None:
        return None
    skipped, complete = _count(counts.get("skipped")) or 0, _count(counts.get("complete"))
    detail = f"{pruned} pruned, {failed} failed" + (f", {skipped} skipped" if skipped else "")
    noun = "trial" if total == 1 else "trials"
    if complete == 0:
        return f"no trial of {total} completed ({detail})"
    return f"best of {total} {noun} ({detail})"


def maximized(doc: Mapping[str, Any]) -> bool:
    """Whether a higher objective is better (``objective.direction``, else the monitor's
    name, as EarlyStopping decides)."""
    objective = doc.get("objective") if isinstance(doc.get("objective"), Mapping) else {}
    direction = objective.get("direction")
    if direction in ("maximize", "minimize"):
        return direction == "maximize"
    return monitor_rises(str(objective.get("monitor") or ""))


def _epochs(value: Any) -> tuple[tuple[int, float], ...]:
    found = []
    for key, objective in (value.items() if isinstance(value, Mapping) else ()):
        try:
            epoch = int(key)
        except (TypeError, ValueError):
            continue
        if _real(objective) is not None:
            found.append((epoch, float(objective)))
    return tuple(sorted(found))


def trials(doc: Mapping[str, Any]) -> list[Trial]:
    """The document's trials in slot order; entries without a number are left out."""
    found = []
    for entry in doc.get("trials") or ():
        if not isinstance(entry, Mapping) or _count(entry.get("number")) is None:
            continue
        params = entry.get("params")
        found.append(Trial(
            number=entry["number"],
            state=str(entry.get("state") or "unknown"),
            value=_real(entry.get("value")),
            epochs=_epochs(entry.get("epochs")),
            params=dict(params) if isinstance(params, Mapping) else {},
            duration_s=_real(entry.get("duration_s")),
            error=str(entry.get("error") or ""),
            continued_from=str(entry.get("continued_from") or ""),
            run_id=run_id_of(entry)))
    return sorted(found, key=lambda t: t.number)


def run_id_of(entry: Mapping[str, Any]) -> str:
    """A trial's run id: ``run_id``, or (a ``sweep.json`` written before it was kept)
    the last part of its ``run_dir``, which is ``<runs directory>/<run id>``."""
    if entry.get("run_id"):
        return str(entry["run_id"])
    run_dir = entry.get("run_dir")
    return PurePath(run_dir).name if isinstance(run_dir, str) else ""


def searched(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The space searched (``space``: each field's distribution as the config wrote it);
    {} for a ``sweep.json`` without one."""
    space = doc.get("space")
    if not isinstance(space, Mapping):
        return {}
    return {str(name): spec for name, spec in space.items() if isinstance(spec, Mapping)}


def space_text(spec: Mapping[str, Any]) -> str:
    """A distribution in words: ``0.0003 to 0.03, log scale``, ``16 to 256, step 32``,
    ``one of 32, 64``."""
    choices = spec.get("choices")
    if isinstance(choices, (list, tuple)):
        return "one of " + ", ".join(value_text(c) for c in choices)
    for kind in ("float", "int"):
        bounds = spec.get(kind)
        if isinstance(bounds, (list, tuple)) and len(bounds) == 2:
            text = f"{value_text(bounds[0])} to {value_text(bounds[1])}"
            if spec.get("log"):
                text += ", log scale"
            if spec.get("step") is not None:
                text += f", step {value_text(spec['step'])}"
            return text
    return str(dict(spec))


def best_number(doc: Mapping[str, Any]) -> int | None:
    """The best trial's number (``best.number``); None without one."""
    best = doc.get("best")
    return _count(best.get("number")) if isinstance(best, Mapping) else None


def value_text(value: Any) -> str:
    """A searched value as text: 4 significant digits for a real number."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def duration_text(seconds: float | None) -> str | None:
    """``12.3 s``, ``5 min 12 s``, ``2 h 05 min``; None when not recorded."""
    if seconds is None:
        return None
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value_text(value)}" for name, value in params.items())


def sweep_section(doc: Mapping[str, Any], images: Mapping[str, str | None]) -> dict[str, Any]:
    """What the Sweep section of ``report.html`` shows; ``images``: the plots
    ``sweep_plots.plot_sweep`` drew (``objective``, ``params``: a file name or None)."""
    objective = doc.get("objective") if isinstance(doc.get("objective"), Mapping) else {}
    monitor = str(objective.get("monitor") or "objective")
    study = doc.get("study") if isinstance(doc.get("study"), Mapping) else {}
    best = doc.get("best") if isinstance(doc.get("best"), Mapping) else None
    listed = trials(doc)
    best_no = best_number(doc)
    best_values = None
    if best is not None:
        params = best.get("params") if isinstance(best.get("params"), Mapping) else {}
        best_values = {"trial": best_no, monitor: _real(best.get("value")),
                       **{name: value_text(value) for name, value in params.items()},
                       "run id": run_id_of(best) or None}
    continued = any(t.continued_from for t in listed)
    return {
        "line": trials_line(doc.get("counts")),
        "objective": f"{monitor}, {'higher' if maximized(doc) else 'lower'} is better",
        "best": best_values,
        "space": {name: space_text(spec) for name, spec in searched(doc).items()},
        "study": {"storage": study.get("storage"), "study": study.get("name")},
        "headers": ["trial", "state", monitor, "epochs run", "duration", "values", "error",
                    *(["continued from"] if continued else [])],
        "rows": [{"best": t.number == best_no, "state": t.state,
                  "cells": [t.number, t.state, t.value, t.epochs[-1][0] if t.epochs else 0,
                            duration_text(t.duration_s), _params_text(t.params) or None,
                            t.error or None,
                            *([t.continued_from or None] if continued else [])]}
                 for t in listed],
        "images": dict(images),
    }
