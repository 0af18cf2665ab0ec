"""The report published with every model version: one HTML page and its PNG plots.

``build_report(model_dir)`` reads what training and evaluation wrote into the model
directory (``history.json``, ``evaluation.json``, ``config.json``, ``run.json``) and
writes ``<model_dir>/report/``:

* ``index.html``            the page: decision and reasons, champion versus challenger,
                            learning curves, test metrics per class, confusion matrix,
                            data fingerprint, strategy, effective config, software;
* ``learning_curves.png``   loss, accuracy and learning rate per epoch, train and
                            validation, with the epochs where the learning rate dropped
                            and the epoch whose weights early stopping kept;
* ``confusion_matrix.png``  test-split counts, rows true class, columns predicted.

Because ``report/`` lives in the model directory, ``pipeline.publish`` uploads it with
the version: the report of version ``V`` of model ``M`` is
``models/M/versions/V/report/index.html`` in the store, its PNGs beside it.

The page is self-contained: inline CSS, images by relative path, no script and no
external URL. Every value from the run (model names, reasons, config strings) is
HTML-escaped. Matplotlib draws through ``matplotlib.figure.Figure`` on the Agg canvas,
so no pyplot state and no display are involved; TensorFlow is never imported. A file
that is missing (a report built before evaluation) leaves its sections saying so.

``python -m training.report MODEL_DIR`` rebuilds the report of a model directory.
"""

from __future__ import annotations

import html
import json
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from training.errors import ReportError, TrainingError

__all__ = ["REPORT_DIR", "build_report", "plot_confusion_matrix", "plot_learning_curves"]

REPORT_DIR = "report"
INDEX = "index.html"
LEARNING_CURVES = "learning_curves.png"
CONFUSION_MATRIX = "confusion_matrix.png"
_INPUTS = ("history.json", "evaluation.json", "config.json", "run.json")
# Beyond this many classes the matrix cells are too small to print their counts.
_ANNOTATE_MAX_CLASSES = 20
# PNG metadata without the matplotlib version: the same inputs give the same bytes.
_PNG_METADATA = {"Software": None}


# ---------------------------------------------------------------------------- plots


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def plot_learning_curves(history: Mapping[str, Any], path: str | Path) -> dict[str, Any]:
    """Draw loss, accuracy and learning rate per epoch into the PNG ``path``.

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
    fig = _figure(4.2 * max(len(panels), 1), 3.6)
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    if not panels:
        axes[0].text(0.5, 0.5, "no per-epoch metrics recorded", ha="center", va="center")
        axes[0].set_axis_off()
    for ax, (name, title) in zip(axes, panels, strict=False):
        if name == "learning_rate":
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
    fig.savefig(path, format="png", metadata=_PNG_METADATA)
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
    fig = _figure(side + 1.0, side)
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
    fig.savefig(path, format="png", metadata=_PNG_METADATA)
    return {"classes": n, "annotated": 0 < n <= _ANNOTATE_MAX_CLASSES}


# ----------------------------------------------------------------------------- HTML


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    """A value for a table cell, escaped; floats with 4 decimals (4 digits below 0.01)."""
    if value is None:
        return "&mdash;"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return _e(value)
        return _e(f"{value:.4g}" if abs(value) < 1e-2 and value else f"{value:.4f}")
    if isinstance(value, (list, tuple)):
        return _e(", ".join(str(v) for v in value)) if value else "&mdash;"
    if isinstance(value, dict):
        return _e(json.dumps(value, sort_keys=True))
    return _e(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    attr = f' class="{_e(cls)}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pairs(mapping: Mapping[str, Any], cls: str = "") -> str:
    return _table(["name", "value"], [(k, v) for k, v in mapping.items()], cls)


def _missing(what: str) -> str:
    return f'<p class="missing">{_e(what)} was not recorded for this version.</p>'


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2rem;
color:#1f2328;max-width:1200px}
h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;
border-bottom:1px solid #d0d7de;padding-bottom:.3rem}h3{font-size:1rem}
table{border-collapse:collapse;margin:.5rem 0 1rem}th,td{border:1px solid #d0d7de;
padding:.25rem .6rem;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f6f8fa}.sub{color:#59636e;margin-top:0}img{max-width:100%;height:auto;
border:1px solid #d0d7de}.verdict{display:inline-block;padding:.2rem .6rem;border-radius:1rem;
font-weight:600}.promote{background:#dafbe1;color:#116329}.keep{background:#fff1e5;
color:#953800}.forced{background:#ffebe9;color:#a40e26}.missing{color:#953800}
code{background:#f6f8fa;padding:0 .2rem}
"""


def _decision_section(evaluation: Mapping[str, Any] | None) -> str:
    if evaluation is None:
        return "<h2>Decision</h2>" + _missing("The evaluation (evaluation.json)")
    decision = evaluation.get("decision") or {}
    if decision.get("forced"):
        verdict, cls = "promoted (forced)", "forced"
    elif decision.get("promote"):
        verdict, cls = "promote to production", "promote"
    else:
        verdict, cls = "keep the production model", "keep"
    reasons = "".join(f"<li>{_e(r)}</li>" for r in decision.get("reasons", []))
    challenger = evaluation.get("challenger") or {}
    champion = evaluation.get("champion")
    rows = [(m, challenger.get(m), champion.get(m) if champion else None)
            for m in ("accuracy", "loss", "macro_f1")]
    champ_name = f"champion {champion.get('version')}" if champion else "champion (none)"
    policy = evaluation.get("policy") or {}
    return (
        "<h2>Decision</h2>"
        f'<p><span class="verdict {cls}">{_e(verdict)}</span></p>'
        f"<h3>Reasons</h3><ul class=\"reasons\">{reasons}</ul>"
        "<h3>Champion versus challenger (same test split)</h3>"
        + _table(["metric", f"challenger {evaluation.get('version', '')}", champ_name], rows,
                 "comparison")
        + ("" if champion else "<p>No model was in production when this version was "
           "evaluated.</p>")
        + "<h3>Promotion policy</h3>" + _pairs(policy, "policy")
    )


def _training_section(history: Mapping[str, Any] | None, marks: Mapping[str, Any] | None) -> str:
    if history is None or marks is None:
        return "<h2>Learning curves</h2>" + _missing("The training history (history.json)")
    es = history.get("early_stopping") or {}
    epochs = history.get("epochs", [])
    metrics = history.get("metrics", {})
    lrs = metrics.get("learning_rate", [])
    drops = []
    for epoch in marks["lr_drops"]:
        i = epochs.index(epoch) if epoch in epochs else -1
        before = lrs[i - 1] if 0 < i <= len(lrs) - 1 else None
        after = lrs[i] if 0 <= i < len(lrs) else None
        drops.append((epoch, before, after))
    summary = {
        "epochs run": len(epochs),
        "monitored metric": es.get("monitor"),
        "best epoch": es.get("best_epoch"),
        "best value": es.get("best_value"),
        "best epoch's weights restored": es.get("restored_best_weights"),
        "stopped early at epoch": es.get("stopped_epoch"),
    }
    drop_table = (_table(["first epoch at the lower rate", "learning rate before",
                          "learning rate after"], drops, "lr-drops") if drops
                  else '<p class="lr-drops">The learning rate was never reduced.</p>')
    names = list(metrics)
    per_epoch = [[e, *(metrics[n][i] if i < len(metrics[n]) else None for n in names)]
                 for i, e in enumerate(epochs)]
    return (
        "<h2>Learning curves</h2>"
        f'<img src="{LEARNING_CURVES}" alt="loss, accuracy and learning rate per epoch, '
        'train and validation">'
        + _pairs(summary, "early-stopping")
        + "<h3>Learning-rate reductions</h3>" + drop_table
        + "<details><summary>Every epoch</summary>"
        + _table(["epoch", *names], per_epoch, "history") + "</details>"
    )


def _metrics_section(evaluation: Mapping[str, Any] | None) -> str:
    if evaluation is None or not evaluation.get("challenger"):
        return "<h2>Test metrics</h2>" + _missing("The evaluation (evaluation.json)")
    challenger = evaluation["challenger"]
    overall = {k: challenger.get(k) for k in ("examples", "accuracy", "loss", "macro_f1")}
    per_class = [(c.get("class"), c.get("precision"), c.get("recall"), c.get("f1"),
                  c.get("support")) for c in challenger.get("per_class", [])]
    return (
        "<h2>Test metrics</h2>" + _pairs(overall, "overall")
        + "<h3>Confusion matrix</h3>"
        f'<img src="{CONFUSION_MATRIX}" alt="confusion matrix of the test split">'
        + "<h3>Per class</h3>"
        + _table(["class", "precision", "recall", "F1", "support"], per_class, "per-class")
    )


def _data_section(run: Mapping[str, Any] | None,
                  evaluation: Mapping[str, Any] | None) -> str:
    if run is None:
        key = evaluation.get("dataset") if evaluation else None
        return ("<h2>Data</h2>" + (_pairs({"key": key}, "dataset") if key else "")
                + _missing("The run record (run.json)"))
    dataset = dict(run.get("dataset") or {})
    strategy = run.get("strategy") or {}
    software = run.get("software") or {}
    return (
        "<h2>Data</h2>" + _pairs(dataset, "dataset")
        + "<h2>Distribution strategy</h2>" + _pairs(strategy, "strategy")
        + "<h2>Software versions</h2>" + _pairs(software, "software")
    )


def _config_section(config: Mapping[str, Any] | None) -> str:
    if config is None:
        return "<h2>Effective config</h2>" + _missing("The effective config (config.json)")
    rows = []
    for section, fields in config.items():
        if isinstance(fields, Mapping):
            rows.extend((section, k, v) for k, v in fields.items())
        else:
            rows.append(("", section, fields))
    return "<h2>Effective config</h2>" + _table(["section", "field", "value"], rows, "config")


def render_html(*, history: Mapping[str, Any] | None, evaluation: Mapping[str, Any] | None,
                config: Mapping[str, Any] | None, run: Mapping[str, Any] | None,
                marks: Mapping[str, Any] | None) -> str:
    """The report page from the four records (any of them may be None)."""
    evaluation_ = evaluation or {}
    name = evaluation_.get("model_name") or (config or {}).get("storage", {}).get("model_name")
    version = evaluation_.get("version") or (run or {}).get("run_id") or ""
    title = f"{name or 'model'} version {version}".strip()
    started = (run or {}).get("started_at")
    dataset_key = evaluation_.get("dataset") or ((run or {}).get("dataset") or {}).get("key")
    sub = " &middot; ".join(p for p in (
        f"dataset <code>{_e(dataset_key)}</code>" if dataset_key else "",
        f"training started {_e(started)}" if started else "",
    ) if p)
    # Served by the Models page at /models/<name>/versions/<version>/report/index.html:
    # four levels up is the page, and the anchor is this version's row there.
    back = "../../../../" + (f"#{quote(name)}/{quote(version)}" if name and version else "")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f'<nav class="back"><a href="{_e(back)}">&larr; Models page</a></nav>'
        f"<h1>{_e(title)}</h1><p class=\"sub\">{sub}</p>"
        + _decision_section(evaluation)
        + _training_section(history, marks)
        + _metrics_section(evaluation)
        + _data_section(run, evaluation)
        + _config_section(config)
        + "</body></html>\n"
    )


# ---------------------------------------------------------------------------- build


def _read(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ReportError(f"{path} is not valid JSON ({err}); rewrite it by re-running the "
                          "step that produced it") from err


def build_report(model_dir: str | Path) -> Path:
    """Write ``<model_dir>/report/`` (index.html and its PNGs); return index.html's path.

    Re-running replaces the previous report whole: the new one is written beside it
    and moved into place, so a reader never sees half of each.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ReportError(f"model directory {os.fspath(model_dir)!r} does not exist; pass "
                          "the run's model/ directory (it holds history.json)")
    history, evaluation, config, run = (_read(model_dir, n) for n in _INPUTS)
    if history is None and evaluation is None:
        raise ReportError(f"{os.fspath(model_dir)!r} has neither history.json nor "
                          "evaluation.json; train (and evaluate) before building a report")

    final = model_dir / REPORT_DIR
    partial = model_dir / f".{REPORT_DIR}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    marks = None
    if history is not None:
        marks = plot_learning_curves(history, partial / LEARNING_CURVES)
    if evaluation is not None and evaluation.get("challenger"):
        plot_confusion_matrix(evaluation["challenger"].get("confusion_matrix", []),
                              partial / CONFUSION_MATRIX)
    (partial / INDEX).write_text(render_html(history=history, evaluation=evaluation,
                                             config=config, run=run, marks=marks),
                                 encoding="utf-8")
    old = model_dir / f".{REPORT_DIR}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final / INDEX


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m training.report MODEL_DIR\n\nBuild MODEL_DIR/report/"
              "index.html from the run's history, evaluation, config and run records.")
        return 0 if args and args[0] in ("-h", "--help") else 2
    try:
        print(build_report(args[0]))
    except TrainingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0
