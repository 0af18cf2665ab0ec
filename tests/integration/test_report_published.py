"""The report of a real trained and evaluated model, published with its version."""

from __future__ import annotations

import json
import logging
import re

import pytest
from markupsafe import escape
from support.png import png_size

from training import report
from training.layout import model_dir
from training.registry.local import FileStore
from training.registry.versions import open_registry
from training.steps import evaluate, publish

pytestmark = pytest.mark.slow

AT = "2026-11-30T03:00:00+00:00"


def test_evaluate_builds_the_report_and_publish_carries_it(trained_run, staged_digits,
                                                           tmp_path, caplog):
    cfg, result = trained_run
    cfg = cfg.with_overrides({"store_uri": str(tmp_path / "store"), "min_accuracy": 0.5})
    registry = open_registry(cfg.storage.store_uri)
    out = model_dir(cfg.run_dir())
    assert str(cfg.run_dir()) == result.run_dir

    with caplog.at_level(logging.INFO, logger="training.steps.evaluate"):
        evaluation = evaluate.evaluate(cfg, staged_digits, registry)
    index = out / "report" / "index.html"
    assert f"report: {index}" in caplog.text
    assert f"models/{cfg.model_name}/versions/{cfg.run_id}/report/index.html" in caplog.text

    page = index.read_text()
    history = json.loads((out / "history.json").read_text())
    run = json.loads((out / "run.json").read_text())
    config = json.loads((out / "config.json").read_text())
    for reason in evaluation["decision"]["reasons"]:
        assert escape(reason) in page  # the template engine's autoescape
    assert run["dataset"]["fingerprint"] in page and run["dataset"]["key"] in page
    for name, version in run["software"].items():
        assert f"<td>{name}</td><td>{version}</td>" in page
    assert f"<td>fit</td><td>epochs</td><td>{config['fit']['epochs']}</td>" in page
    assert f"<td>model</td><td>name</td><td>{config['model']['name']}</td>" in page
    es = history["early_stopping"]
    best = es["best_epoch"]
    assert f"<td>best epoch</td><td>{best}</td>" in page
    # The marks drawn are those of history.json.
    marks = report.plot_learning_curves(history, tmp_path / "curves.png")
    assert marks["lr_drops"] == history["lr_reduced_at_epochs"]
    assert marks["best_epoch"] == best and marks["stopped_epoch"] == es["stopped_epoch"]
    drops = re.findall(r"<tr><td>(\d+)</td>", page.split('class="lr-drops"')[1].split(
        "</table>")[0]) if history["lr_reduced_at_epochs"] else []
    assert [int(d) for d in drops] == history["lr_reduced_at_epochs"]
    classes = len(evaluation["challenger"]["per_class"])
    assert page.count("<tr><td>", page.index('class="per-class"')) >= classes

    publish.publish(cfg, registry, created=AT)
    store = FileStore(tmp_path / "store")
    prefix = f"models/{cfg.model_name}/versions/{cfg.run_id}/report/"
    published = store.get_bytes(prefix + "index.html").decode()
    assert published == page
    for name in ("learning_curves.png", "confusion_matrix.png"):
        data = store.get_bytes(prefix + name)
        width, height = png_size(data)
        assert width >= 300 and height >= 300 and len(data) > 5_000
        assert f'src="{name}"' in published
    files = {e["path"] for e in registry.show(cfg.model_name, cfg.run_id)["files"]}
    assert {"report/index.html", "report/learning_curves.png",
            "report/confusion_matrix.png"} <= files
