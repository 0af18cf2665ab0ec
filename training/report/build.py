"""Build a model directory's report from the run's JSON records, atomically."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from training import files
from training.errors import ReportError
from training.layout import (
    CONFIG,
    DATA_STATS,
    EVALUATION,
    HISTORY,
    REPORT_DIR,
    REPORT_INDEX,
    RUN,
)
from training.report.plots import (
    CONFUSION_MATRIX,
    LEARNING_CURVES,
    plot_confusion_matrix,
    plot_learning_curves,
)
from training.report.render import render_report
from training.report.sweep import sweep_section
from training.report.sweep_plots import plot_sweep
from training.sweep.record import SWEEP_JSON

__all__ = ["build_report"]


def _read(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ReportError(f"{path} is not valid JSON ({err}); rewrite it by re-running the "
                          "step that produced it") from err


def build_report(model_dir: str | os.PathLike[str]) -> Path:
    """Write ``<model_dir>/report/`` (index.html and its PNGs); return index.html's path.

    Re-running replaces the previous report whole: the new one is written beside it
    and moved into place, so a reader never sees half of each.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ReportError(f"model directory {os.fspath(model_dir)!r} does not exist; pass "
                          f"the run's model/ directory (it holds {HISTORY})")
    history, evaluation, config, run, data_stats, sweep = (
        _read(model_dir, n) for n in (HISTORY, EVALUATION, CONFIG, RUN, DATA_STATS, SWEEP_JSON))
    if history is None and evaluation is None:
        raise ReportError(f"{os.fspath(model_dir)!r} has neither {HISTORY} nor {EVALUATION}; "
                          "train (and evaluate) before building a report")

    final = model_dir / REPORT_DIR
    files.finish_dir_swap(final, last_file=REPORT_INDEX)  # a build a crash cut short
    partial = files.pending_dir(final)  # written whole, then swapped in
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    marks = None
    if history is not None:
        marks = plot_learning_curves(history, partial / LEARNING_CURVES)
    if evaluation is not None and evaluation.get("challenger"):
        plot_confusion_matrix(evaluation["challenger"].get("confusion_matrix", []),
                              partial / CONFUSION_MATRIX)
    section = None
    if isinstance(sweep, dict):  # a version picked by a sweep (training.sweep.record)
        section = sweep_section(sweep, plot_sweep(sweep, partial))
    (partial / REPORT_INDEX).write_text(
        render_report(history=history, evaluation=evaluation, config=config, run=run,
                      marks=marks, data_stats=data_stats, sweep=section),
        encoding="utf-8")
    files.swap_dir(final)
    return final / REPORT_INDEX
