"""The Sweep section's plots, drawn like the report's others (``plots.figure``, Agg,
deterministic PNG bytes) into the report directory beside index.html.

* ``sweep_objective.png``: left, each trial's objective after each epoch, one line per
  trial (completed solid, pruned dashed and ending in a cross, failed dotted, the best
  trial thick); right, each trial's final objective by trial number with the best so
  far as a step line, failed trials (no objective) as faint vertical lines;
* ``sweep_params.png``: one small scatter per searched parameter, its value against
  the objective (pruned trials hollow: their objective is from an earlier epoch; failed
  ones have none). Each axis follows the field's distribution in ``sweep.json``'s
  ``space``: a range searched on a log scale (``"log": true``) gets a log axis, a
  ``choices`` field its choices as categories, in their order, side by side, any other
  range a linear axis. Without a recorded space (an older ``sweep.json``), a parameter
  whose values are all positive and span more than two decades gets a log axis, and one
  with a value that is not a number is drawn as categories. The figure's title is
  wrapped to its width, so it fits with one searched field as with many.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.report.plots import PNG_METADATA, figure
from training.report.sweep import Trial, best_number, maximized, searched, trials, value_text

__all__ = ["SWEEP_OBJECTIVE", "SWEEP_PARAMS", "categories", "param_scale", "plot_sweep",
           "title_lines"]

SWEEP_OBJECTIVE = "sweep_objective.png"
SWEEP_PARAMS = "sweep_params.png"
# How each state is drawn; any other state (skipped, unknown) is drawn as failed.
_STYLE = {"complete": {"color": "tab:blue", "linestyle": "-"},
          "pruned": {"color": "tab:orange", "linestyle": "--"},
          "failed": {"color": "tab:red", "linestyle": ":"}}
_BEST = {"color": "tab:green", "linewidth": 2.5}
_COLUMNS = 4  # parameter scatters per row
_SCATTER_WIDTH, _SCATTER_HEIGHT = 3.3, 2.9  # inches, each parameter's scatter
_MIN_WIDTH = 5.0  # inches: one searched field still gets a readable figure
_CHAR_WIDTH = 0.075  # inches of an average character of the title (medium, 100 dpi)
_LOG_SPAN = 100.0  # more than two decades between the smallest and largest value


def _style(state: str) -> dict[str, str]:
    return _STYLE.get(state, _STYLE["failed"])


def _is_real(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def param_scale(values: Sequence[Any], spec: Mapping[str, Any] | None = None) -> str:
    """How a parameter's axis is drawn. By its distribution ``spec`` (the space's), when
    given: ``categories`` for ``choices``, ``log`` for a range searched on a log scale,
    ``linear`` for another range. Without one: ``categories`` when a value is not a
    number, ``log`` when all are positive and span more than two decades, else
    ``linear``. A value that does not fit the axis (not a number; not positive on a
    log axis) falls back to categories or linear."""
    real = bool(values) and all(_is_real(v) for v in values)
    if spec is not None and "choices" in spec:
        return "categories"
    if spec is not None and ("float" in spec or "int" in spec):
        if not values:
            return "log" if spec.get("log") else "linear"
        if not real:
            return "categories"
        return "log" if spec.get("log") and min(values) > 0 else "linear"
    if not real:
        return "categories"
    if min(values) > 0 and max(values) / min(values) > _LOG_SPAN:
        return "log"
    return "linear"


def categories(values: Sequence[Any], spec: Mapping[str, Any] | None = None) -> list[str]:
    """A categorical axis's labels: the space's choices in their order, then any other
    value found (sorted); without choices, the values found, sorted."""
    found = {value_text(v) for v in values}
    listed = spec.get("choices") if spec is not None else None
    ordered = [value_text(c) for c in listed] if isinstance(listed, (list, tuple)) else []
    ordered = list(dict.fromkeys(ordered))
    return ordered + sorted(found - set(ordered))


def title_lines(parts: Sequence[str], width_in: float) -> str:
    """The title's ``parts`` on one line when they fit a figure ``width_in`` inches wide,
    else each on lines of its own, wrapped to that width."""
    chars = max(20, int(width_in / _CHAR_WIDTH))
    if len(" ".join(parts)) <= chars:
        return " ".join(parts)
    return "\n".join(textwrap.fill(part, chars) for part in parts)


def _legend_once(ax: Any, seen: set[str], key: str, label: str) -> str | None:
    """``label`` the first time ``key`` is drawn on ``ax``'s figure, then None."""
    if key in seen:
        return None
    seen.add(key)
    return label


def _curves(ax: Any, listed: Sequence[Trial], best: int | None, monitor: str) -> int:
    seen: set[str] = set()
    drawn = 0
    for t in listed:
        if not t.epochs:
            continue
        drawn += 1
        xs, ys = [e for e, _ in t.epochs], [v for _, v in t.epochs]
        if t.number == best:
            ax.plot(xs, ys, marker=".", zorder=3, label=f"best: trial {t.number}", **_BEST)
            continue
        label = _legend_once(ax, seen, t.state, t.state)
        ax.plot(xs, ys, marker=".", alpha=0.75, linewidth=1.2, label=label, **_style(t.state))
        if t.state == "pruned":
            ax.plot(xs[-1], ys[-1], marker="x", markersize=8, color=_style(t.state)["color"])
    if not drawn:
        ax.text(0.5, 0.5, "no trial reported an epoch", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_title(f"{monitor} after each epoch, per trial")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
    ax.set_xlabel("epoch")
    ax.set_ylabel(monitor)
    return drawn


def _finals(ax: Any, listed: Sequence[Trial], best: int | None, monitor: str,
            higher: bool) -> None:
    seen: set[str] = set()
    running: list[tuple[int, float]] = []
    for t in listed:
        if t.value is None:
            ax.axvline(t.number, alpha=0.35, linewidth=1, color=_style("failed")["color"],
                       linestyle=":", label=_legend_once(ax, seen, "none", "no objective"))
            continue
        style = _style(t.state)
        hollow = t.state != "complete"
        ax.scatter([t.number], [t.value], s=36, zorder=3,
                   marker="o", edgecolors=style["color"],
                   facecolors="none" if hollow else style["color"],
                   label=_legend_once(ax, seen, t.state, t.state))
        if t.state == "complete":
            last = running[-1][1] if running else None
            better = last is None or (t.value > last if higher else t.value < last)
            running.append((t.number, t.value if better else last))
    if running:
        ax.step([n for n, _ in running], [v for _, v in running], where="post",
                color="tab:gray", linewidth=1, label="best so far")
    chosen = next((t for t in listed if t.number == best and t.value is not None), None)
    if chosen is not None:
        ax.scatter([chosen.number], [chosen.value], s=160, marker="*", zorder=4,
                   color=_BEST["color"], label=f"best: trial {chosen.number}")
    ax.set_title(f"final {monitor} by trial")
    ax.set_xlabel("trial")
    ax.set_ylabel(monitor)
    if listed:
        ax.set_xticks(sorted({t.number for t in listed})[::max(1, len(listed) // 12)])


def plot_objective(listed: Sequence[Trial], best: int | None, monitor: str, higher: bool,
                   path: str | Path) -> dict[str, Any]:
    """Draw ``sweep_objective.png`` (module doc) into ``path``."""
    fig = figure(11.0, 3.8)
    left, right = fig.subplots(1, 2)
    drawn = _curves(left, listed, best, monitor)
    _finals(right, listed, best, monitor, higher)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.savefig(path, format="png", metadata=PNG_METADATA)
    return {"curves": drawn}


def _scatter(ax: Any, name: str, listed: Sequence[Trial], best: int | None,
             seen: set[str], spec: Mapping[str, Any] | None) -> str:
    values = [t.params[name] for t in listed if name in t.params]
    scale = param_scale(values, spec)
    labels = categories(values, spec) if scale == "categories" else []
    for i, t in enumerate(listed):
        if name not in t.params or t.value is None:
            continue
        x = t.params[name]
        if scale == "categories":  # side by side within the category, the same each time
            x = labels.index(value_text(x)) + ((i % 5) - 2) * 0.06
        style = _style(t.state)
        if t.number == best:
            ax.scatter([x], [t.value], s=140, marker="*", zorder=4, color=_BEST["color"],
                       label=_legend_once(ax, seen, "best", "best trial"))
            continue
        ax.scatter([x], [t.value], s=28, zorder=3, edgecolors=style["color"],
                   facecolors="none" if t.state != "complete" else style["color"],
                   label=_legend_once(ax, seen, t.state, t.state))
    if scale == "categories":
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlim(-0.5, len(labels) - 0.5)
    elif scale == "log":
        ax.set_xscale("log")
    ax.set_title(name, fontsize="medium")
    ax.grid(True, alpha=0.3)
    return scale


def plot_params(listed: Sequence[Trial], best: int | None, monitor: str,
                path: str | Path, space: Mapping[str, Mapping[str, Any]] | None = None,
                ) -> dict[str, str]:
    """Draw ``sweep_params.png`` (module doc) into ``path``, each axis by its field's
    distribution in ``space`` when given; return each parameter's axis
    (``param_scale``). Nothing is drawn, and {} returned, without a parameter."""
    space = space or {}
    names = sorted({name for t in listed for name in t.params})
    if not names:
        return {}
    columns = min(len(names), _COLUMNS)
    rows = math.ceil(len(names) / columns)
    width = max(_SCATTER_WIDTH * columns, _MIN_WIDTH)
    fig = figure(width, _SCATTER_HEIGHT * rows)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    seen: set[str] = set()
    scales = {}
    for index, (ax, name) in enumerate(zip(axes, names, strict=False)):
        scales[name] = _scatter(ax, name, listed, best, seen if index == 0 else set(),
                                space.get(name))
        if index % columns == 0:
            ax.set_ylabel(monitor)
    for ax in axes[len(names):]:
        ax.set_axis_off()
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize="x-small")
    fig.suptitle(title_lines([f"{monitor} by searched value",
                              "(pruned: hollow, at the epoch they stopped)"], width),
                 fontsize="medium")
    fig.savefig(path, format="png", metadata=PNG_METADATA)
    return scales


def plot_sweep(doc: Mapping[str, Any], directory: str | Path) -> dict[str, Any]:
    """Draw the Sweep section's plots into ``directory``; return the file names drawn
    (``objective``; ``params``, None without a searched parameter) and each parameter's
    axis (``scales``)."""
    listed = trials(doc)
    objective = doc.get("objective") if isinstance(doc.get("objective"), Mapping) else {}
    monitor = str(objective.get("monitor") or "objective")
    best = best_number(doc)
    directory = Path(directory)
    plot_objective(listed, best, monitor, maximized(doc), directory / SWEEP_OBJECTIVE)
    scales = plot_params(listed, best, monitor, directory / SWEEP_PARAMS, searched(doc))
    return {"objective": SWEEP_OBJECTIVE, "params": SWEEP_PARAMS if scales else None,
            "scales": scales}
