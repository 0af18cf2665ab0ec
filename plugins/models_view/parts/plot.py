"""The geometry of a model's accuracy plot: test accuracy (and holdout accuracy where a
version's evaluation has one) per version, in publish order, the production version
marked.

``accuracy_plot`` only computes coordinates, ticks and labels; the ``plot.html``
template draws them as inline SVG, so every text in it goes through the template's
autoescape and no script is needed. Versions are evenly spaced in publish order (the
oldest on the left) and labelled with the date they were created, so two versions made
on the same day stay apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 58, 624, 34, 190  # the plot area inside the SVG
INSET = 18  # between the plot area's sides and the first and last version
MAX_X_LABELS = 8
MIN_SPAN = 0.02  # the y axis spans at least this much accuracy
STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.2, 0.25)
# (key of the version entry, series name shown in the legend, CSS class)
SERIES = (("test_accuracy", "test accuracy", "test"),
          ("holdout_accuracy", "holdout accuracy", "holdout"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _y_axis(values: Sequence[float]) -> tuple[float, float, float]:
    """(lowest, highest, step) of the y axis: round steps around ``values``, in [0, 1]
    when the values are."""
    lo, hi = min(values), max(values)
    if hi - lo < MIN_SPAN:
        middle = (lo + hi) / 2
        lo, hi = middle - MIN_SPAN / 2, middle + MIN_SPAN / 2
    step = next((s for s in STEPS if (hi - lo) / s <= 5), STEPS[-1])
    low, high = math.floor(lo / step) * step, math.ceil(hi / step) * step
    if min(values) >= 0 and low < 0:
        low = 0.0
    if max(values) <= 1 and high > 1:
        high = 1.0
    return low, high, step


def _tick_text(value: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


def _x_positions(count: int) -> list[float]:
    if count == 1:
        return [(LEFT + RIGHT) / 2]
    width = RIGHT - LEFT - 2 * INSET
    return [LEFT + INSET + i * width / (count - 1) for i in range(count)]


def _path(points: Sequence[dict[str, Any]]) -> str:
    """An SVG path through the points (a version without a value is skipped)."""
    return " ".join(f"{'L' if i else 'M'}{p['x']:.1f},{p['y']:.1f}" for i, p in enumerate(points))


def accuracy_plot(versions: Sequence[dict[str, Any]], production: str | None
                  ) -> dict[str, Any] | None:
    """The plot of ``versions`` (as the page lists them: most recently published first,
    with ``test_accuracy`` and ``holdout_accuracy``); None when no version has one."""
    ordered = list(reversed(versions))  # publish order
    if not any(_number(v.get(key)) is not None for v in ordered for key, *_ in SERIES):
        return None
    xs = _x_positions(len(ordered))
    low, high, step = _y_axis([n for v in ordered for key, *_ in SERIES
                               if (n := _number(v.get(key))) is not None])

    def y_of(value: float) -> float:
        return BOTTOM - (value - low) / (high - low) * (BOTTOM - TOP)

    series = []
    for key, label, css in SERIES:
        points = [{"x": x, "y": y_of(value), "value": value, "version": entry["version"],
                   "production": entry["version"] == production}
                  for x, entry in zip(xs, ordered, strict=True)
                  if (value := _number(entry.get(key))) is not None]
        if points:
            series.append({"name": label, "class": css, "path": _path(points),
                           "points": points})
    every = math.ceil(len(ordered) / MAX_X_LABELS)
    last = len(ordered) - 1  # the newest is always labelled, then every ``every``-th
    x_ticks = [{"x": x, "label": str(entry.get("created") or "")[:10]
                if (last - i) % every == 0 else ""}
               for i, (x, entry) in enumerate(zip(xs, ordered, strict=True))]
    count = round((high - low) / step)
    y_ticks = [{"y": y_of(low + i * step), "label": _tick_text(low + i * step, step)}
               for i in range(count + 1)]
    marked = next((p for p in series[0]["points"] if p["production"]), None) if (
        series and series[0]["class"] == "test") else None
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": RIGHT, "top": TOP,
            "bottom": BOTTOM, "series": series, "x_ticks": x_ticks, "y_ticks": y_ticks,
            "production": marked}
