"""The Models page's line for a version a sweep picked, from a real local store.

The page's rows are built by ``models_view.parts.listing.collect`` and shown by
``models_view.page.render_index``; both run here on a file store holding two published
versions, one with ``sweep.json`` (written by ``training.sweep.record``) and a report,
one without. The page in a real api-server and browser is tests/system/test_models_page.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from training.registry import open_store
from training.registry.versions import ModelRegistry
from training.sweep.record import SWEEP_JSON, TrialRecord, counts, write_sweep_json

REPO = Path(__file__).resolve().parents[2]
MODEL = "digits-mlp"
PLAIN, SWEPT = "20260101-a", "20260102-b"  # published in this order


def trials() -> list[TrialRecord]:
    def trial(number: int, state: str, value: float | None, error: str = "") -> TrialRecord:
        return TrialRecord(number=number, optuna_number=number, attempt=0,
                           params={"fit.learning_rate": 10.0 ** -(number + 1)}, state=state,
                           value=value, epochs={1: value or 0.5}, duration_s=10.0 + number,
                           run_dir=f"runs/night-t{number}", error=error)

    return [trial(0, "complete", 0.91), trial(1, "pruned", 0.52),
            trial(2, "failed", None, "ResourceExhaustedError"), trial(3, "complete", 0.94),
            trial(4, "pruned", 0.6)]


@pytest.fixture
def listing(monkeypatch):
    monkeypatch.syspath_prepend(os.fspath(REPO / "plugins"))
    from models_view.parts import listing

    return listing


def publish(registry: ModelRegistry, directory: Path, version: str, created: str) -> None:
    (directory / "model.keras").write_bytes(f"weights of {version}".encode())
    (directory / "evaluation.json").write_text('{"backend": "jax", "images_per_s": 1200.0}')
    registry.publish(MODEL, version, directory, run_id=f"manual__{created}", created=created,
                     metrics={"accuracy": 0.9})


@pytest.fixture
def store(tmp_path) -> tuple[ModelRegistry, list[TrialRecord]]:
    registry = ModelRegistry(open_store(os.fspath(tmp_path / "store")))
    plain, swept = tmp_path / PLAIN, tmp_path / SWEPT
    plain.mkdir()
    swept.mkdir()
    publish(registry, plain, PLAIN, "2026-01-01T00:00:00+00:00")
    records = trials()
    best = max((t for t in records if t.state == "complete"), key=lambda t: t.value)
    write_sweep_json(swept, records, best, storage="sqlite:///runs/.sweeps/m.db", study="m.1",
                     objective="val_accuracy", direction="maximize")
    (swept / "report").mkdir()
    (swept / "report" / "index.html").write_text("<!DOCTYPE html><h2 id=sweep>Sweep</h2>")
    publish(registry, swept, SWEPT, "2026-01-02T00:00:00+00:00")
    return registry, records


def test_a_version_with_sweep_json_says_how_many_trials_it_was_picked_from(listing, store):
    from models_view import page

    registry, records = store
    models = listing.collect(registry)
    versions = {entry["version"]: entry for entry in models[0]["versions"]}
    done = counts(records)
    line = f"best of {done['trials']} trials ({done['pruned']} pruned, {done['failed']} failed)"
    assert versions[SWEPT]["sweep"] == line
    assert versions[PLAIN]["sweep"] is None
    assert versions[SWEPT]["backend"] == versions[PLAIN]["backend"] == "jax"  # as before

    shown = page.render_index(models, registry.store.uri)
    rows = dict(re.findall(r'<tr class="version[^"]*" id="[^"]+" data-version="([^"]+)">'
                           r'(.*?)</tr>', shown, re.S))
    assert line in rows[SWEPT]
    # It links to the Sweep section of the version's report.
    assert (f'<a href="{MODEL}/versions/{SWEPT}/report/index.html#sweep">{line}</a>'
            in rows[SWEPT])
    assert 'class="sweep"' not in rows[PLAIN] and "trials (" not in rows[PLAIN]


def test_sweep_json_is_read_once_and_only_its_counts_are_kept(listing, store):
    from models_view.parts.stores import JSON_FILES

    registry, records = store
    reads: list[str] = []
    get_bytes = registry.store.get_bytes

    def counted(key: str) -> bytes:
        reads.append(key)
        return get_bytes(key)

    registry.store.get_bytes = counted
    first = listing.collect(registry)
    again = listing.collect(registry)
    sweep_key = f"models/{MODEL}/versions/{SWEPT}/{SWEEP_JSON}"
    assert reads.count(sweep_key) == 1  # a published version never changes: cached
    assert first[0]["versions"] == again[0]["versions"]
    entry = next(e for e in first[0]["versions"] if e["version"] == SWEPT)
    kept = JSON_FILES.read(registry, sweep_key, (entry["published"], entry["run_id"]),
                           keep=listing.sweep_counts)
    assert kept == counts(records) and reads.count(sweep_key) == 1
