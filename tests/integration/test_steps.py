"""The steps evaluate -> publish -> promote on a real trained model, against a local store."""

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from training import produced
from training.errors import RegistryError
from training.layout import model_dir
from training.registry.versions import open_registry
from training.steps import evaluate, promote, publish

pytestmark = pytest.mark.slow

AT = "2026-11-30T03:00:00+00:00"


def _copied_run(trained_run, run_id, tmp_path):
    """A run ``run_id`` on a fresh local store, its directory a copy of the trained one."""
    cfg, result = trained_run
    run = cfg.with_overrides({"run_id": run_id, "store_uri": str(tmp_path / "store"),
                              "min_accuracy": 0.5})
    shutil.copytree(result.run_dir, run.run_dir())
    return run, open_registry(run.storage.store_uri)


def test_first_model_is_promoted_and_a_worse_or_equal_one_is_kept_out_with_reasons(
    trained_run, staged_digits, tmp_path
):
    cfg, result = trained_run
    cfg = cfg.with_overrides({"store_uri": str(tmp_path / "store"), "min_accuracy": 0.5})
    registry = open_registry(cfg.storage.store_uri)

    first = evaluate.evaluate(cfg, staged_digits, registry)
    assert first["champion"] is None
    assert first["decision"]["promote"] is True
    published = publish.publish(cfg, registry, created=AT)
    assert published["version"] == cfg.run_id
    assert publish.publish(cfg, registry, created=AT) == published  # a retry is a no-op
    assert promote.promote(cfg, registry, at=AT)["promoted"] is True
    assert registry.production(cfg.model_name) == cfg.run_id
    assert promote.promote(cfg, registry, at=AT)["promoted"] is True  # retry: no-op
    assert len(registry.history(cfg.model_name)) == 1

    # The same weights as a second run: no improvement, so production stays.
    second = cfg.with_overrides({"run_id": "second", "min_improvement": 0.01})
    shutil.copytree(result.run_dir, second.run_dir())
    evaluation = evaluate.evaluate(second, staged_digits, registry)
    assert evaluation["champion"]["version"] == cfg.run_id
    assert evaluation["champion"]["accuracy"] == pytest.approx(
        evaluation["challenger"]["accuracy"])
    assert evaluation["decision"]["promote"] is False
    assert any("< required +0.0100" in r for r in evaluation["decision"]["reasons"])
    saved = json.loads((model_dir(second.run_dir()) / "evaluation.json").read_text())
    assert saved["decision"] == evaluation["decision"]
    publish.publish(second, registry, created=AT)
    outcome = promote.promote(second, registry, at=AT)
    assert outcome["promoted"] is False and outcome["reasons"]
    assert registry.production(cfg.model_name) == cfg.run_id

    # Published: re-evaluating (a retried task) keeps the published decision, even when
    # the settings would now decide otherwise; promote reads the published decision.
    again = second.with_overrides({"run_id": "second", "min_improvement": -1.0})
    assert evaluate.evaluate(again, staged_digits, registry)["decision"] == evaluation[
        "decision"]
    assert promote.promote(again, registry, at=AT)["promoted"] is False

    # Forced, as a new run: promoted, and recorded as forced.
    forced = second.with_overrides({"run_id": "third", "force_promote": True})
    shutil.copytree(result.run_dir, forced.run_dir())
    evaluate.evaluate(forced, staged_digits, registry)
    with pytest.raises(RegistryError, match="is not published"):
        promote.promote(forced, registry, at=AT)
    publish.publish(forced, registry, created=AT)
    assert promote.promote(forced, registry, at=AT)["forced"] is True
    assert registry.production(cfg.model_name) == "third"
    assert registry.history(cfg.model_name)[-1]["forced"] is True
    files = {e["path"] for e in registry.show(cfg.model_name, "third")["files"]}
    assert files >= {"model.keras", "evaluation.json", "config.json",
                     "saved_model/saved_model.pb", "report/index.html"}
    assert not any(p.startswith("checkpoints") for p in files)
    assert Path(result.run_dir).exists()


def test_each_step_works_on_the_run_directory_it_is_handed(trained_run, staged_digits,
                                                            tmp_path):
    """Airflow passes train's run directory on through XCom: a worker whose own
    settings point elsewhere still evaluates and publishes the directory it was given."""
    cfg, result = trained_run
    handed = tmp_path / "moved-run"
    shutil.copytree(result.run_dir, handed)
    (handed / "model" / "evaluation.json").unlink(missing_ok=True)
    elsewhere = cfg.with_overrides({"store_uri": str(tmp_path / "store"),
                                    "output_dir": str(tmp_path / "not-here")})
    registry = open_registry(elsewhere.storage.store_uri)
    evaluation = evaluate.evaluate(elsewhere, staged_digits, registry, run_dir=handed)
    assert json.loads((handed / "model" / "evaluation.json").read_text()) == evaluation
    published = publish.publish(elsewhere, registry, created=AT, run_dir=handed)
    assert published["files"] == len(registry.show(cfg.model_name, cfg.run_id)["files"])
    assert not (tmp_path / "not-here").exists()
    with pytest.raises(RegistryError, match=f"the run has no trained model at "
                                            f"{tmp_path / 'empty'}/model/model.keras"):
        evaluate.evaluate(elsewhere.with_overrides({"model_name": "other"}), staged_digits,
                          registry, run_dir=tmp_path / "empty")


def _promote_in_a_fresh_process(cfg, tmp_path) -> tuple[bool, bool]:
    """``steps.promote.promote`` in a process of its own: (promoted, whether Keras loaded)."""
    import subprocess
    import sys

    config = tmp_path / f"{cfg.run_id}.json"
    config.write_text(cfg.to_json())
    code = ("import json, sys\nfrom training.steps import promote\n"
            "from training.registry.versions import open_registry\n"
            "from training.config import RunConfig\n"
            f"cfg = RunConfig.from_file({str(config)!r})\n"
            f"done = promote.promote(cfg, open_registry(cfg.storage.store_uri), at={AT!r})\n"
            "print(json.dumps([done['promoted'], 'keras' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    promoted, keras_loaded = json.loads(done.stdout.splitlines()[-1])
    return promoted, keras_loaded


def test_an_evaluation_stands_until_what_it_was_made_of_changes(trained_run, staged_digits,
                                                                 tmp_path):
    """What the Airflow ``evaluate`` task trusts instead of loading TensorFlow: the
    training process's evaluation, as long as it is still the evaluation it would make;
    and what ``promote`` trusts instead of loading the model with Keras."""
    cfg, result = trained_run
    run = cfg.with_overrides({"run_id": "standing", "store_uri": str(tmp_path / "store"),
                              "min_accuracy": 0.5})
    shutil.copytree(result.run_dir, run.run_dir())
    (model_dir(run.run_dir()) / "evaluation.json").unlink(missing_ok=True)
    registry = open_registry(run.storage.store_uri)
    evaluation, why = evaluate.standing_evaluation(run, staged_digits, registry)
    assert evaluation is None and why.endswith("evaluation.json does not exist")

    made = evaluate.evaluate(run, staged_digits, registry)
    assert evaluate.standing_evaluation(run, staged_digits, registry)[0] == made
    stricter = run.with_overrides({"min_accuracy": 0.6})
    assert "policy" in evaluate.standing_evaluation(stricter, staged_digits, registry)[1]

    # Another model in production since: the decision was made against the wrong one.
    other = cfg.with_overrides({"run_id": "other", "store_uri": run.storage.store_uri,
                                "min_accuracy": 0.5})
    shutil.copytree(result.run_dir, other.run_dir())
    (model_dir(other.run_dir()) / "evaluation.json").unlink(missing_ok=True)
    evaluate.evaluate(other, staged_digits, registry)
    publish.publish(other, registry, created=AT)
    # Promoted without Keras: its evaluation loaded and ran this very model file.
    assert _promote_in_a_fresh_process(other, tmp_path) == (True, False)
    evaluation, why = evaluate.standing_evaluation(run, staged_digits, registry)
    assert evaluation is None and "production is now other" in why, why

    # Evaluated again, then the model file changes under it: evaluated again.
    evaluate.evaluate(run, staged_digits, registry)
    model = model_dir(run.run_dir()) / "model.keras"
    model.write_bytes(model.read_bytes() + b"\0")
    evaluation, why = evaluate.standing_evaluation(run, staged_digits, registry)
    assert evaluation is None and "model file changed" in why


def test_promotion_checks_the_model_with_keras_unless_its_evaluation_ran_that_file(
        trained_run, staged_digits, tmp_path):
    run, registry = _copied_run(trained_run, "unchecked", tmp_path)
    evaluate.evaluate(run, staged_digits, registry)
    path = model_dir(run.run_dir()) / "evaluation.json"
    evaluation = json.loads(path.read_text())
    evaluation["model_check"]["sha256"] = "0" * 64  # says it checked another file
    path.write_text(json.dumps(evaluation))
    publish.publish(run, registry, created=AT)
    assert _promote_in_a_fresh_process(run, tmp_path) == (True, True)  # Keras checked it


def test_publish_uploads_what_the_steps_recorded_and_names_what_it_leaves_out(
    trained_run, staged_digits, tmp_path, caplog
):
    run, registry = _copied_run(trained_run, "recorded", tmp_path)
    evaluate.evaluate(run, staged_digits, registry)
    out = model_dir(run.run_dir())
    recorded = produced.read(run.run_dir())
    assert {"model.keras", "saved_model/saved_model.pb", "trained.json"} <= set(
        recorded["train"])
    assert {"evaluation.json", "report/index.html"} <= set(recorded["evaluate"])

    # A recorded file that is gone stops the publish before anything is uploaded.
    (out / "history.json").rename(tmp_path / "history.json")
    with pytest.raises(RegistryError, match=r"file\(s\) the steps recorded are gone from "
                                            r".*: history.json; train the run again"):
        publish.publish(run, registry, created=AT)
    assert registry.store.list(f"models/{run.model_name}/") == []
    (tmp_path / "history.json").rename(out / "history.json")

    # A file nobody recorded (a 2 MiB download left in model/) is left out, named.
    (out / "stray.bin").write_bytes(os.urandom(2 << 20))
    with caplog.at_level(logging.WARNING, logger="training.produced"):
        publish.publish(run, registry, created=AT)
    manifest = registry.show(run.model_name, run.run_id)
    paths = sorted(entry["path"] for entry in manifest["files"])
    # publish records one file of its own: the MLmodel that makes the version an MLflow
    # model where it lies (training/tracking/mlmodel.py)
    assert paths == sorted({f for files in recorded.values() for f in files} | {"MLmodel"})
    assert "stray.bin" not in paths
    assert "left out of the version, produced by no step: stray.bin (2.0 MiB)" in caplog.text


def test_new_data_statistics_make_the_evaluation_again(trained_run, staged_digits, tmp_path):
    run, registry = _copied_run(trained_run, "restats", tmp_path)
    stats = {"examples": {"train": 1}, "note": "validate_data's"}
    made = evaluate.evaluate(run, staged_digits, registry, data_stats=stats)
    assert evaluate.already_evaluated(run, staged_digits, registry, data_stats=stats)[0] == made
    assert evaluate.already_evaluated(run, staged_digits, registry)[0] == made  # none given
    evaluation, why = evaluate.already_evaluated(run, staged_digits, registry,
                                                 data_stats={**stats, "note": "new"})
    assert evaluation is None and "other data statistics" in why, why


def test_a_published_evaluation_is_written_back_for_publish(trained_run, staged_digits,
                                                            tmp_path):
    """The run's evaluation.json lost after publish: the evaluate step's rule finds the
    published one, writes it back and records it, so publish goes on (no dead end)."""
    run, registry = _copied_run(trained_run, "restored", tmp_path)
    made = evaluate.evaluate(run, staged_digits, registry)
    publish.publish(run, registry, created=AT)
    local = model_dir(run.run_dir()) / "evaluation.json"
    local.unlink()
    records = run.run_dir() / "produced.json"
    records.write_text(json.dumps({k: v for k, v in produced.read(run.run_dir()).items()
                                   if k != "evaluate"}))
    evaluation, why = evaluate.already_evaluated(run, staged_digits, registry)
    assert evaluation == made and "already published" in why
    assert json.loads(local.read_text()) == made
    assert "evaluation.json" in produced.read(run.run_dir())["evaluate"]
    assert evaluate.read_evaluation(run) == made
    assert publish.publish(run, registry, created=AT)["version"] == run.run_id  # stands


def test_an_approved_version_deleted_meanwhile_is_refused_and_nothing_moves(
        trained_run, staged_digits, tmp_path):
    run, registry = _copied_run(trained_run, "deleted", tmp_path)
    evaluate.evaluate(run, staged_digits, registry)
    publish.publish(run, registry, created=AT)
    # Someone cleaned the store while the run waited for approval.
    shutil.rmtree(registry.store.root / "models" / run.model_name / "versions" / run.run_id)
    with pytest.raises(RegistryError, match=rf"model '{run.model_name}' version "
                                            rf"'{run.run_id}' is not published"):
        promote.promote(run, registry, at=AT,
                        approval={"approved": True, "by": "ana", "reason": "fine"})
    assert registry.production(run.model_name) is None
