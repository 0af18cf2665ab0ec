"""What the Models page lists: every model, the version in production, its versions
most recently published first, the promotion history, and the accuracy plot.

Each version comes with its manifest's metrics, whether it has a report, and, from its
published ``evaluation.json`` (read once per version and cached, see ``stores``): the
dataset it was trained on, the Keras backend that trained it and how fast (training
images per second, the median epoch), and its holdout accuracy where the evaluation has
a holdout; for a version a hyperparameter sweep picked, the line "best of N trials
(k pruned, f failed)" from its published ``sweep.json`` (only its counts are read into
the cache).
Each version not in production gets the action the page offers for it: ``promote`` for
one published after production (or any, before the first promotion), ``rollback`` for
one published before it.
"""

from __future__ import annotations

from typing import Any

from models_view.parts.plot import accuracy_plot
from models_view.parts.stores import JSON_FILES
from training.errors import IntegrityError
from training.layout import EVALUATION, MODELS_PREFIX, REPORT_DIR, REPORT_INDEX, version_key
from training.report.sweep import trials_line
from training.sweep.record import SWEEP_JSON

# A version's report page, relative to the version (``layout.version_key``).
REPORT_FILE = f"{REPORT_DIR}/{REPORT_INDEX}"


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _evaluation_facts(evaluation: Any) -> dict[str, Any]:
    """The dataset key, the Keras backend that trained the model and the holdout
    accuracy of a published ``evaluation.json``."""
    if not isinstance(evaluation, dict):
        return {"dataset": None, "backend": None, "images_per_s": None,
                "holdout_accuracy": None}
    holdout = evaluation.get("holdout")
    challenger = holdout.get("challenger") if isinstance(holdout, dict) else None
    accuracy = challenger.get("accuracy") if isinstance(challenger, dict) else None
    dataset = evaluation.get("dataset")
    backend = evaluation.get("backend", "tensorflow")  # before the choice: TensorFlow
    return {"dataset": dataset if isinstance(dataset, str) and dataset else None,
            "backend": backend if isinstance(backend, str) and backend else None,
            "images_per_s": _number(evaluation.get("images_per_s")),
            "holdout_accuracy": _number(accuracy)}


def sweep_counts(document: Any) -> Any:
    """What the page keeps of a version's ``sweep.json``: its counts (the trials, with
    every epoch's objective, may be long)."""
    return document.get("counts") if isinstance(document, dict) else None


def offered_action(index: int, production_index: int | None) -> str | None:
    """What the page offers for the version at ``index`` (most recently published first):
    nothing for production, ``promote`` for a newer one, ``rollback`` for an older one."""
    if production_index is None or index < production_index:
        return "promote"
    return None if index == production_index else "rollback"


def describe_versions(registry: Any, name: str, versions: list[dict[str, Any]],
                      keys: set[str], production: str | None) -> None:
    """Add what the page shows beside each version's manifest entry, in place."""
    order = [entry["version"] for entry in versions]
    production_index = order.index(production) if production in order else None
    for index, entry in enumerate(versions):
        version = entry["version"]
        entry["has_report"] = version_key(name, version, REPORT_FILE) in keys
        entry["test_accuracy"] = _number((entry.get("metrics") or {}).get("accuracy"))
        publication = (entry.get("published"), entry["run_id"])
        key = version_key(name, version, EVALUATION)
        evaluation = JSON_FILES.read(registry, key, publication) if key in keys else None
        entry.update(_evaluation_facts(evaluation))
        key = version_key(name, version, SWEEP_JSON)
        entry["sweep"] = (trials_line(JSON_FILES.read(registry, key, publication,
                                                      keep=sweep_counts))
                          if key in keys else None)
        entry["action"] = offered_action(index, production_index)


def collect(registry: Any) -> list[dict[str, Any]]:
    """Every model with its production version, versions (newest first), history and
    accuracy plot."""
    keys = set(registry.store.list(MODELS_PREFIX))
    models = []
    for name in registry.list_models():
        versions = registry.list_versions(name)
        try:
            production, history, problem = registry.production(name), registry.history(name), None
        except IntegrityError as exc:  # one damaged pointer must not hide every model
            production, history, problem = None, [], str(exc)
        describe_versions(registry, name, versions, keys, production)
        if problem:  # which way a version would move is unknown: offer nothing
            for entry in versions:
                entry["action"] = None
        models.append({
            "name": name,
            "production": production,
            "versions": versions,
            "history": history,
            "problem": problem,
            "plot": accuracy_plot(versions, production),
        })
    return models
