"""HTML from the one Jinja2 template set of ``training/report/templates/``.

Both the version report and the Models page (``plugins/models_view``) render through
``environment()``: one base layout, one stylesheet (``style.css``), and Jinja2's
autoescape for every ``.html`` template, so every value from a run or the store (model
names, reasons, config strings) is HTML-escaped by the template engine and nowhere
else. The filters below only turn values into text; they never produce markup.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from training.report.plots import CONFUSION_MATRIX, LEARNING_CURVES
from training.report.sweep import SWEEP_ANCHOR

__all__ = ["environment", "render", "render_report"]

# The Models page's key metrics, in its column order (also the report's comparison rows).
KEY_METRICS = ("accuracy", "loss", "macro_f1")


def cell_text(value: Any) -> str | None:
    """A report table cell as text; None where nothing was recorded (shown as a dash).

    Floats get 4 decimals (4 significant digits below 0.01), booleans yes/no, lists are
    joined with commas and mappings written as sorted JSON.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e-2 and value else f"{value:.4f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else None
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def metric_text(value: Any) -> str | None:
    """A Models page metric: numbers with 4 decimals, None (a dash) where missing."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return f"{value:.4f}"
    return str(value)


def url_segment(value: Any) -> str:
    """``value`` percent-encoded as one URL path segment or fragment part ('/' too)."""
    return quote(str(value), safe="")


@functools.cache
def environment() -> Any:
    """The template environment (built once): autoescape on for ``.html`` templates."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("training.report", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(cell=cell_text, metric=metric_text, url_segment=url_segment)
    env.globals.update(KEY_METRICS=KEY_METRICS, LEARNING_CURVES=LEARNING_CURVES,
                       CONFUSION_MATRIX=CONFUSION_MATRIX, SWEEP_ANCHOR=SWEEP_ANCHOR)
    return env


def render(template: str, **context: Any) -> str:
    """``template`` of the set rendered with ``context``."""
    return environment().get_template(template).render(**context)


# ----------------------------------------------------------------------- the report


def _verdict(decision: Mapping[str, Any]) -> tuple[str, str]:
    if decision.get("forced"):
        return "promoted (forced)", "forced"
    if decision.get("promote"):
        return "promote to production", "promote"
    return "keep the production model", "keep"


def _decision(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    decision = evaluation.get("decision") or {}
    verdict, verdict_class = _verdict(decision)
    challenger = evaluation.get("challenger") or {}
    champion = evaluation.get("champion")
    return {
        "verdict": verdict,
        "verdict_class": verdict_class,
        "reasons": list(decision.get("reasons", [])),
        "headers": ["metric", f"challenger {evaluation.get('version', '')}",
                    f"champion {champion.get('version')}" if champion else "champion (none)"],
        "rows": [(m, challenger.get(m), champion.get(m) if champion else None)
                 for m in KEY_METRICS],
        "has_champion": bool(champion),
        "policy": evaluation.get("policy") or {},
    }


def _training(history: Mapping[str, Any], marks: Mapping[str, Any]) -> dict[str, Any]:
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
    names = list(metrics)
    return {
        "summary": {
            "epochs run": len(epochs),
            "monitored metric": es.get("monitor"),
            "best epoch": es.get("best_epoch"),
            "best value": es.get("best_value"),
            "best epoch's weights restored": es.get("restored_best_weights"),
            "stopped early at epoch": es.get("stopped_epoch"),
        },
        "drops": drops,
        "metric_names": names,
        "per_epoch": [[e, *(metrics[n][i] if i < len(metrics[n]) else None for n in names)]
                      for i, e in enumerate(epochs)],
    }


def _test_metrics(challenger: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "overall": {k: challenger.get(k) for k in ("examples", "accuracy", "loss", "macro_f1")},
        "per_class": [(c.get("class"), c.get("precision"), c.get("recall"), c.get("f1"),
                       c.get("support")) for c in challenger.get("per_class", [])],
    }


def _holdout(evaluation: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pinned holdout's scores, challenger beside champion (None without one)."""
    holdout = evaluation.get("holdout")
    if not holdout:
        return None
    challenger, champion = holdout.get("challenger") or {}, holdout.get("champion")
    return {
        "about": {"images": holdout.get("uri"), "examples": holdout.get("examples"),
                  "fingerprint": holdout.get("fingerprint")},
        "headers": ["metric", f"challenger {evaluation.get('version', '')}",
                    f"champion {champion.get('version')}" if champion else "champion (none)"],
        "rows": [(m, challenger.get(m), champion.get(m) if champion else None)
                 for m in KEY_METRICS],
    }


def _rounded(values: list[float] | None) -> list[str] | None:
    """Per-channel pixel statistics (0-255) to two decimals."""
    return [f"{v:.2f}" for v in values] if values else None


def _at(values: list[Any] | None, index: int) -> Any:
    return values[index] if values and index < len(values) else None


def _data(data_stats: Mapping[str, Any]) -> dict[str, Any]:
    """validate_data's statistics and verdicts (``data_stats.json``) as tables."""
    stats = data_stats.get("statistics") or {}
    verdict = data_stats.get("verdict") or {}
    splits = stats.get("splits") or {}
    names = stats.get("label_names") or []
    return {
        "about": {"snapshot": data_stats.get("dataset"),
                  "compared with production": data_stats.get("compared_with"),
                  "image shape": stats.get("image_shape"),
                  "image dtype": stats.get("image_dtype"),
                  "exact duplicates across splits": (stats.get("duplicates") or {}).get("count"),
                  "verdict": "passed" if verdict.get("passed") else "failed"},
        "checks": [(c.get("name"), "passed" if c.get("passed") else "FAILED", c.get("detail"))
                   for c in verdict.get("checks", [])],
        "split_headers": ["split", "read as", "examples", "pixel mean", "pixel std"],
        "splits": [(n, s.get("split"), s.get("num_examples"), _rounded(s.get("pixel_mean")),
                    _rounded(s.get("pixel_std"))) for n, s in splits.items()],
        "class_headers": ["class", *splits],
        "classes": [(name, *(_at(s.get("class_counts"), i) for s in splits.values()))
                    for i, name in enumerate(names)],
    }


def _config_rows(config: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    rows: list[tuple[str, str, Any]] = []
    for section, fields in config.items():
        if isinstance(fields, Mapping):
            rows.extend((section, k, v) for k, v in fields.items())
        else:
            rows.append(("", section, fields))
    return rows


def _speed(throughput: Any) -> dict[str, Any] | None:
    """How fast the run trained and on what, as the report's name/value rows."""
    if not isinstance(throughput, dict):
        return None  # a version trained before runs measured it
    accelerator = throughput.get("accelerator") or {}
    rows = {"training images per second (median epoch)": throughput.get("images_per_s"),
            "step time, ms (median epoch)": throughput.get("step_ms"),
            "peak memory, MiB": throughput.get("peak_memory_mb"),
            "memory measured": throughput.get("memory_measured"),
            "accelerator": " x ".join(str(v) for v in (accelerator.get("count"),
                                                        accelerator.get("name")) if v)}
    return {k: (f"{v:,.1f}" if isinstance(v, float) else v) for k, v in rows.items()
            if v not in (None, "")}


def _starting_weights(run: Mapping[str, Any]) -> str | None:
    """Where training started when ``model.warm_start`` was on (run.json's
    ``warm_start``): "warm-started from <version>", or why it could not; None when off."""
    warm = run.get("warm_start")
    if not isinstance(warm, Mapping):
        return None
    if warm.get("from_version"):
        return f"warm-started from {warm['from_version']} (production's weights)"
    return str(warm.get("note") or "warm start on, from fresh weights")


def render_report(*, history: Mapping[str, Any] | None, evaluation: Mapping[str, Any] | None,
                  config: Mapping[str, Any] | None, run: Mapping[str, Any] | None,
                  marks: Mapping[str, Any] | None,
                  data_stats: Mapping[str, Any] | None = None,
                  sweep: Mapping[str, Any] | None = None) -> str:
    """The report page from the records (any of them may be None), the marks
    ``plot_learning_curves`` drew and, for a version a sweep picked, the Sweep section
    (``sweep.sweep_section``)."""
    evaluation_ = evaluation or {}
    run_ = run or {}
    name = evaluation_.get("model_name") or (config or {}).get("storage", {}).get("model_name")
    version = evaluation_.get("version") or run_.get("run_id") or ""
    challenger = evaluation_.get("challenger")
    # Served by the Models page at /models/<name>/versions/<version>/report/index.html:
    # four levels up is the page, and the anchor is this version's row there.
    back = "../../../../" + (f"#{quote(name)}/{quote(version)}" if name and version else "")
    return render(
        "report.html",
        title=f"{name or 'model'} version {version}".strip(),
        back=back,
        dataset_key=evaluation_.get("dataset") or (run_.get("dataset") or {}).get("key"),
        started=run_.get("started_at"),
        starting_weights=_starting_weights(run_),
        decision=_decision(evaluation) if evaluation is not None else None,
        holdout=_holdout(evaluation) if evaluation is not None else None,
        data=_data(data_stats) if data_stats is not None else None,
        training=(_training(history, marks) if history is not None and marks is not None
                  else None),
        test_metrics=_test_metrics(challenger) if challenger else None,
        run=({"dataset": dict(run.get("dataset") or {}),
              "strategy": {k: v for k, v in (run.get("strategy") or {}).items()
                           if k != "accelerator"},  # the Speed table says it in words
              "speed": _speed(run.get("throughput")),
              "software": run.get("software") or {}} if run is not None else None),
        config_rows=_config_rows(config) if config is not None else None,
        sweep=sweep,
    )
