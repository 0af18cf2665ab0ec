"""The report's plots: matplotlib ``Figure`` on the Agg canvas, no pyplot, no display.

The same inputs give the same PNG bytes (the matplotlib version is left out of the PNG
metadata), so a rebuilt report is byte-identical and a published one can be checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CONFUSION_MATRIX", "LEARNING_CURVES", "plot_confusion_matrix",
           "plot_learning_curves"]

# The plots' file names inside the report directory (layout.REPORT_DIR), beside index.html.
LEARNING_CURVES = "learning_curves.png"
CONFUSION_MATRIX = "confusion_matrix.png"
# Beyond this many classes the matrix cells are too small to print their counts.
_ANNOTATE_MAX_CLASSES = 20
# PNG metadata without the matplotlib version: the same inputs give the same bytes
# (``sweep_plots`` draws with the same figure and metadata).
PNG_METADATA = {"Software": None}


def figure(width: float, height: float) -> Any:
    """A matplotlib ``Figure`` on the Agg canvas (no pyplot), laid out by constraint."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def plot_learning_curves(history: Mapping[str, Any], path: str | Path) -> dict[str, Any]:
    """Draw loss, accuracy, learning rate and training images/s per epoch into the PNG
    ``path``.

    Returns where the marks were drawn (1-based epochs, as in ``history.json``):
    ``{"lr_drops": [...], "best_epoch": n | None, "restored_best_weights": bool,
    "stopped_epoch": n | None, "panels": [...]}``. A learning-rate drop at epoch ``e``
    means epoch ``e`` was the first to train at the lower rate; the line is drawn at
    ``e``.
    """
    epochs = [int(e) for e in history.get("epochs", [])]
    metrics: Mapping[str, Sequence[float]] = history.get("metrics", {})
    es = history.get("early_stopping") or {}
    lr_drops = [int(e) for e in history.get("lr_reduced_at_epochs", [])]
    best = es.get("best_epoch")
    restored = bool(es.get("restored_best_weights"))
    stopped = es.get("stopped_epoch")

    panels = [(name, name.replace("_", " ")) for name in ("loss", "accuracy")
              if name in metrics or f"val_{name}" in metrics]
    if "learning_rate" in metrics:
        panels.append(("learning_rate", "learning rate"))
    if "images_per_s" in metrics:  # callbacks.throughput: the training part of each epoch
        panels.append(("images_per_s", "training images/s"))
    fig = figure(4.2 * max(len(panels), 1), 3.6)
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    if not panels:
        axes[0].text(0.5, 0.5, "no per-epoch metrics recorded", ha="center", va="center")
        axes[0].set_axis_off()
    for ax, (name, title) in zip(axes, panels, strict=False):
        if name == "images_per_s":
            ax.plot(epochs[:len(metrics[name])], metrics[name], color="tab:cyan", marker=".",
                    label="training images/s")
        elif name == "learning_rate":
            ax.plot(epochs, metrics[name], color="tab:purple", marker=".", label="learning rate")
            rates = [v for v in metrics[name] if v > 0]
            if len(rates) == len(metrics[name]) and rates and max(rates) > 4 * min(rates):
                ax.set_yscale("log")
        else:
            for key, label, color in ((name, "train", "tab:blue"),
                                      (f"val_{name}", "validation", "tab:orange")):
                if key in metrics:
                    ax.plot(epochs[:len(metrics[key])], metrics[key], color=color,
                            marker=".", label=label)
        for i, epoch in enumerate(lr_drops):
            ax.axvline(epoch, color="tab:red", linestyle="--", linewidth=1,
                       label="learning rate reduced" if i == 0 else None)
        if best is not None:
            label = (f"weights restored (epoch {best})" if restored
                     else f"best epoch {best}")
            ax.axvline(best, color="tab:green", linewidth=1.5, label=label)
        if stopped is not None:
            ax.axvline(stopped, color="tab:gray", linestyle=":", linewidth=1,
                       label=f"stopped (epoch {stopped})")
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, format="png", metadata=PNG_METADATA)
    return {"lr_drops": lr_drops, "best_epoch": best, "restored_best_weights": restored,
            "stopped_epoch": stopped, "panels": [name for name, _ in panels]}


def plot_confusion_matrix(matrix: Sequence[Sequence[int]], path: str | Path,
                          labels: Sequence[str] | None = None) -> dict[str, Any]:
    """Draw the confusion matrix (rows: true class, columns: predicted) into ``path``.

    Cells are coloured by the share of the true class (row-normalised, so small classes
    stay visible) and show their counts when there are at most 20 classes.
    """
    import numpy as np

    counts = np.asarray(matrix, dtype=np.int64)
    n = counts.shape[0] if counts.ndim == 2 else 0
    labels = [str(c) for c in (labels if labels is not None else range(n))]
    side = min(max(3.5, 0.45 * n + 2.0), 14.0)
    fig = figure(side + 1.0, side)
    ax = fig.subplots()
    if n == 0:
        ax.text(0.5, 0.5, "no confusion matrix recorded", ha="center", va="center")
        ax.set_axis_off()
    else:
        totals = counts.sum(axis=1, keepdims=True)
        shares = np.divide(counts, totals, out=np.zeros(counts.shape, dtype=float),
                           where=totals > 0)
        image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
        fig.colorbar(image, ax=ax, label="share of the true class")
        ticks = range(n) if n <= _ANNOTATE_MAX_CLASSES else range(0, n, max(1, n // 20))
        ax.set_xticks(list(ticks), [labels[i] for i in ticks])
        ax.set_yticks(list(ticks), [labels[i] for i in ticks])
        ax.set_xlabel("predicted class")
        ax.set_ylabel("true class")
        if n <= _ANNOTATE_MAX_CLASSES:
            for i in range(n):
                for j in range(n):
                    ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=8,
                            color="white" if shares[i, j] > 0.5 else "black")
    ax.set_title("confusion matrix (test split)")
    fig.savefig(path, format="png", metadata=PNG_METADATA)
    return {"classes": n, "annotated": 0 < n <= _ANNOTATE_MAX_CLASSES}
