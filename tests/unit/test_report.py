"""The version report from small synthetic records: plots, marks, escaping, layout."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from support.png import png_size as png_bytes_size

from training import report
from training.errors import TrainingError

INJECTION = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'


def png_size(path: Path) -> tuple[int, int]:
    return png_bytes_size(path.read_bytes(), str(path))


def write_records(model_dir: Path, *, reason: str = "challenger accuracy 0.9000 >= minimum",
                  epochs: int = 8) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    lrs = [1e-3] * 3 + [5e-4] * 3 + [2.5e-4] * (epochs - 6)
    history = {
        "epochs": list(range(1, epochs + 1)),
        "metrics": {
            "loss": [1.0 / (e + 1) for e in range(epochs)],
            "accuracy": [0.5 + 0.05 * e for e in range(epochs)],
            "val_loss": [1.1 / (e + 1) + (0.05 if e > 4 else 0) for e in range(epochs)],
            "val_accuracy": [0.45 + 0.05 * e for e in range(epochs)],
            "learning_rate": lrs,
        },
        "lr_reduced_at_epochs": [4, 7],
        "early_stopping": {"monitor": "val_loss", "stopped_epoch": 8, "best_epoch": 5,
                           "best_value": 0.1833, "restored_best_weights": True},
    }
    evaluation = {
        "model_name": "digits-mlp",
        "version": "manual__2026-11-30",
        "dataset": "digits:1.0.0@b504be350b053dde",
        "challenger": {
            "examples": 6, "loss": 0.51, "accuracy": 0.6667, "macro_f1": 0.65,
            "per_class": [
                {"class": 0, "precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2},
                {"class": 1, "precision": 0.6667, "recall": 1.0, "f1": 0.8, "support": 2},
                {"class": 2, "precision": 1.0, "recall": 0.5, "f1": 0.6667, "support": 2},
            ],
            "confusion_matrix": [[1, 1, 0], [0, 2, 0], [1, 0, 1]],
        },
        "champion": {"version": "nightly-41", "accuracy": 0.7, "loss": 0.45},
        "policy": {"min_accuracy": 0.5, "min_improvement": 0.0, "force_promote": False},
        "decision": {"promote": False, "forced": False,
                     "reasons": [reason, "improvement -0.0333 over champion nightly-41"]},
    }
    config = {"fit": {"epochs": 8, "learning_rate": 0.001, "reduce_lr_factor": 0.5},
              "model": {"name": "mlp"},
              "storage": {"model_name": "", "store_uri": "s3://models/prod"}}
    run = {
        "run_id": "manual__2026-11-30",
        "started_at": "2026-11-30T03:00:00+00:00",
        "dataset": {"name": "digits", "version": "1.0.0", "fingerprint": "b504be350b053dde",
                    "key": "digits:1.0.0@b504be350b053dde"},
        "strategy": {"kind": "mirrored", "replicas_in_sync": 2, "global_batch_size": 128},
        "software": {"python": "3.11.7", "tensorflow": "2.21.0", "keras": "3.15.1"},
    }
    for name, record in (("history.json", history), ("evaluation.json", evaluation),
                         ("config.json", config), ("run.json", run)):
        (model_dir / name).write_text(json.dumps(record))


def table(page: str, cls: str) -> str:
    match = re.search(rf'<table class="{cls}">(.*?)</table>', page, re.S)
    assert match, f"no table {cls!r} in the report"
    return match.group(1)


def test_report_has_both_plots_every_record_and_marks_lr_drops_and_restored_epoch(tmp_path):
    write_records(tmp_path)
    index = report.build_report(tmp_path)

    assert index == tmp_path / "report" / "index.html"
    for name in ("learning_curves.png", "confusion_matrix.png"):
        width, height = png_size(tmp_path / "report" / name)
        assert width >= 300 and height >= 300
        assert 5_000 < (tmp_path / "report" / name).stat().st_size < 2_000_000
    page = index.read_text()
    assert 'src="learning_curves.png"' in page and 'src="confusion_matrix.png"' in page
    # Decision, its reasons and the comparison with the champion.
    assert "keep the production model" in page
    assert "improvement -0.0333 over champion nightly-41" in page
    assert "champion nightly-41" in table(page, "comparison")
    # LR drops: epochs 4 and 7, with the rates before and after.
    drops = table(page, "lr-drops")
    assert re.search(r"<td>4</td><td>0\.001</td><td>0\.0005</td>", drops), drops
    assert re.search(r"<td>7</td><td>0\.0005</td><td>0\.00025</td>", drops), drops
    es = table(page, "early-stopping")
    assert "<td>best epoch</td><td>5</td>" in es
    assert "<td>best epoch&#39;s weights restored</td><td>yes</td>" in es
    assert "<td>stopped early at epoch</td><td>8</td>" in es
    # Per-class metrics, data fingerprint, software, config.
    assert "<td>1</td><td>0.6667</td><td>1.0000</td><td>0.8000</td><td>2</td>" in table(
        page, "per-class")
    assert "b504be350b053dde" in table(page, "dataset")
    assert "<td>tensorflow</td><td>2.21.0</td>" in table(page, "software")
    assert "<td>mirrored</td>" in table(page, "strategy")
    cfg = table(page, "config")
    assert "<td>fit</td><td>reduce_lr_factor</td><td>0.5000</td>" in cfg
    assert "<td>storage</td><td>store_uri</td><td>s3://models/prod</td>" in cfg
    # Self-contained: no script, no external reference.
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert not re.search(r'src="(?!learning_curves\.png|confusion_matrix\.png)', page)


def test_the_holdout_scores_and_the_data_checks_are_reported(tmp_path):
    from training.data.snapshot.validation import ValidationRules, validate

    write_records(tmp_path)
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    evaluation["holdout"] = {
        "uri": "s3://team/holdout", "fingerprint": "0f1e2d3c4b5a6978", "examples": 180,
        "challenger": {"examples": 180, "accuracy": 0.95, "loss": 0.2, "macro_f1": 0.94},
        "champion": {"version": "nightly-41", "examples": 180, "accuracy": 0.9,
                     "loss": 0.3, "macro_f1": 0.89}}
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    split = {"split": "train", "num_examples": 40, "class_counts": [30, 10],
             "pixel_mean": [200.0], "pixel_std": [20.0], "image_shape": [8, 8, 1],
             "image_dtype": "uint8"}
    reference = {"label_names": ["cat", "dog"], "image_shape": [8, 8, 1],
                 "image_dtype": "uint8",
                 "duplicates": {"count": 0, "within_split": 0, "examples": []},
                 "splits": {"train": {**split, "class_counts": [20, 20],
                                      "pixel_mean": [100.0]}}}
    stats = {**reference, "splits": {"train": split, "test": {**split, "split": "test",
                                                              "class_counts": [3, 1]}}}
    verdict = validate(stats, rules=ValidationRules(min_examples_per_class=1,
                                                    max_corrupt_fraction=0.0,
                                                    drift_threshold=0.3),
                       reference=reference)
    (tmp_path / "data_stats.json").write_text(json.dumps(
        {"dataset": "cats:1.0.0@abc", "compared_with": "nightly-41", "statistics": stats,
         "verdict": verdict}))
    page = report.build_report(tmp_path).read_text()

    holdout = table(page, "holdout")
    assert "challenger manual__2026-11-30" in holdout and "champion nightly-41" in holdout
    assert "<td>accuracy</td><td>0.9500</td><td>0.9000</td>" in holdout
    assert "s3://team/holdout" in table(page, "holdout-about")
    checks = table(page, "data-checks")
    assert "<td>drift</td><td>FAILED</td><td>pixel mean moved by 1.00" in checks
    assert "<td>schema</td><td>passed</td>" in checks
    assert "<td>failed</td>" in table(page, "data-about")
    assert "<td>cat</td><td>30</td><td>3</td>" in table(page, "data-classes")
    assert "<td>train</td><td>train</td><td>40</td><td>200.00</td><td>20.00</td>" in table(
        page, "data-splits")


def test_plot_marks_are_the_history_epochs(tmp_path):
    write_records(tmp_path)
    history = json.loads((tmp_path / "history.json").read_text())
    marks = report.plot_learning_curves(history, tmp_path / "curves.png")
    assert marks == {"lr_drops": [4, 7], "best_epoch": 5, "restored_best_weights": True,
                     "stopped_epoch": 8, "panels": ["loss", "accuracy", "learning_rate"]}
    png_size(tmp_path / "curves.png")


def test_user_text_is_escaped_everywhere(tmp_path):
    write_records(tmp_path, reason=INJECTION)
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    evaluation["model_name"] = "<b>bold</b>"
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    config = json.loads((tmp_path / "config.json").read_text())
    config["model"]["name"] = '"><script>x()</script>'
    (tmp_path / "config.json").write_text(json.dumps(config))

    page = report.build_report(tmp_path).read_text()

    assert "<script" not in page and "<img src=x" not in page and "<b>bold" not in page
    # Jinja2's autoescape (MarkupSafe) writes quotes as &#34; and &#39;.
    assert ("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; "
            "&lt;img src=x onerror=alert(1)&gt;") in page
    assert "&lt;b&gt;bold&lt;/b&gt; version manual__2026-11-30" in page
    assert "&#34;&gt;&lt;script&gt;x()&lt;/script&gt;" in page


def test_forced_and_first_model_verdicts(tmp_path):
    write_records(tmp_path)
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    evaluation["decision"] = {"promote": True, "forced": True, "reasons": ["forced: ..."]}
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    assert "promoted (forced)" in report.build_report(tmp_path).read_text()

    evaluation["champion"] = None
    evaluation["decision"] = {"promote": True, "forced": False, "reasons": ["no model"]}
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    page = report.build_report(tmp_path).read_text()
    assert "promote to production" in page and "No model was in production" in page


def test_a_rebuild_replaces_the_report_and_leaves_no_working_directory(tmp_path):
    write_records(tmp_path)
    report.build_report(tmp_path)
    (tmp_path / "report" / "stale.png").write_bytes(b"old")
    first = (tmp_path / "report" / "learning_curves.png").read_bytes()
    report.build_report(tmp_path)
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "confusion_matrix.png", "index.html", "learning_curves.png"]
    assert (tmp_path / "report" / "learning_curves.png").read_bytes() == first  # deterministic
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_missing_evaluation_gives_curves_and_says_what_is_missing(tmp_path):
    write_records(tmp_path)
    (tmp_path / "evaluation.json").unlink()
    page = report.build_report(tmp_path).read_text()
    assert "The evaluation (evaluation.json) was not recorded for this version." in page
    assert not (tmp_path / "report" / "confusion_matrix.png").exists()
    png_size(tmp_path / "report" / "learning_curves.png")


def test_errors_name_the_directory_and_the_fix(tmp_path):
    with pytest.raises(TrainingError, match="does not exist; pass the run's model/"):
        report.build_report(tmp_path / "nope")
    with pytest.raises(TrainingError, match="neither history.json nor evaluation.json"):
        report.build_report(tmp_path)
    write_records(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(TrainingError, match="run.json is not valid JSON"):
        report.build_report(tmp_path)


def test_confusion_matrix_of_many_classes_is_drawn_without_cell_counts(tmp_path):
    n = 40
    matrix = [[5 if i == j else (1 if j == (i + 1) % n else 0) for j in range(n)]
              for i in range(n)]
    info = report.plot_confusion_matrix(matrix, tmp_path / "cm.png")
    assert info == {"classes": n, "annotated": False}
    width, height = png_size(tmp_path / "cm.png")
    assert height <= 1400


def test_building_a_report_does_not_import_tensorflow(tmp_path):
    write_records(tmp_path)
    import subprocess

    code = ("import sys; from training.report import build_report; "
            f"build_report({str(tmp_path)!r}); "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules; "
            "assert 'matplotlib.pyplot' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_cli_builds_the_report(tmp_path, capsys):
    write_records(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "report" / "index.html")
    assert report.main([str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: model directory {str(tmp_path / 'missing')!r} does not exist; "
                   "pass the run's model/ directory (it holds history.json)"], err
    with pytest.raises(SystemExit) as exit_:
        report.main([])
    assert exit_.value.code == 2
    assert "error: the following arguments are required: MODEL_DIR" in capsys.readouterr().err


def test_module_entry_point_rebuilds_the_report(tmp_path):
    import subprocess

    write_records(tmp_path)
    done = subprocess.run([sys.executable, "-m", "training.report", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "report" / "index.html")
    done = subprocess.run([sys.executable, "-m", "training.report", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "MODEL_DIR" in done.stdout, done.stderr


def test_report_and_models_page_share_one_stylesheet_and_autoescape():
    from training.report.render import environment

    env = environment()
    assert env.autoescape("report.html") and env.autoescape("models.html")
    css = env.loader.get_source(env, "style.css")[0]
    for name in ("report.html", "models.html", "refused.html"):
        source = env.loader.get_source(env, name)[0]
        assert '{% extends "base.html" %}' in source and "<style" not in source, name
    assert '{% include "style.css" %}' in env.loader.get_source(env, "base.html")[0]
    page = env.get_template("refused.html").render(title="<t>", detail="d", page_class="x")
    assert css.strip() in page and "&lt;t&gt;" in page and "<t>" not in page


# --------------------------------------------------------------------------- sweeps


WORKER_RUNS = "/tmp/airflow-worker-3/runs"  # where a worker trained the trials


def sweep_records() -> tuple[list, object]:
    """Four trials as the study hands them over (``training.sweep.record.TrialRecord``):
    two completed (their best epoch's objective), one pruned after two epochs (its last),
    one failed (none); and the best of them."""
    from training.sweep.record import TrialRecord

    def trial(number, state, epochs, params, value, error=""):
        return TrialRecord(number=number, optuna_number=number + 40, attempt=0,
                           params=params, state=state, value=value, epochs=epochs,
                           duration_s=30.0 * len(epochs) + number,
                           run_dir=f"{WORKER_RUNS}/night-2-t{number}", error=error,
                           data_fingerprint="b504be350b053dde", run_id=f"night-2-t{number}")

    trials = [
        trial(0, "complete", {1: 0.81, 2: 0.88, 3: 0.9},
              {"fit.learning_rate": 0.0002, "fit.batch_size": 32, "dataset.augment": "none"},
              value=0.9),
        trial(1, "pruned", {1: 0.52, 2: 0.61},
              {"fit.learning_rate": 0.09, "fit.batch_size": 128, "dataset.augment": "flip"},
              value=0.61),
        trial(2, "failed", {1: 0.7},
              {"fit.learning_rate": 0.03, "fit.batch_size": 64, "dataset.augment": "flip"},
              value=None, error=INJECTION),
        trial(3, "complete", {1: 0.86, 2: 0.93, 3: 0.95},
              {"fit.learning_rate": 0.004, "fit.batch_size": 64, "dataset.augment": "flip"},
              value=0.95),
    ]
    best = max((t for t in trials if t.state == "complete"), key=lambda t: t.value)
    return trials, best


def section(page: str, anchor: str) -> str:
    match = re.search(rf'<h2 id="{anchor}">(.*?)(?=<h2)', page, re.S)
    assert match, f"no section {anchor!r} in the report"
    return match.group(1)


def test_a_version_picked_by_a_sweep_gets_its_sweep_section_and_plots(tmp_path):
    from training.report.sweep_plots import plot_sweep
    from training.sweep.record import write_sweep_json

    write_records(tmp_path)
    trials, best = sweep_records()
    write_sweep_json(tmp_path, trials, best, storage="sqlite:///runs/.sweeps/digits-mlp.db",
                     study="digits-mlp.1c561f35", objective="val_accuracy",
                     direction="maximize")
    page = report.build_report(tmp_path).read_text()
    sweep = section(page, "sweep")

    states = [t.state for t in trials]
    assert (f"best of {len(trials)} trials ({states.count('pruned')} pruned, "
            f"{states.count('failed')} failed)") in sweep
    assert "objective val_accuracy, higher is better" in sweep
    chosen = table(sweep, "sweep-best")
    assert f"<td>trial</td><td>{best.number}</td>" in chosen
    assert f"<td>val_accuracy</td><td>{best.value:.4f}</td>" in chosen
    for name, value in best.params.items():  # numbers to 4 significant digits
        shown = f"{value:.4g}" if isinstance(value, float) else value
        assert f"<td>{name}</td><td>{shown}</td>" in chosen
    assert "digits-mlp.1c561f35" in table(sweep, "sweep-study")
    # One row per trial, in order: its number, state and epochs run; the best marked,
    # the failed one with its error (escaped), a pruned one with its last objective.
    rows = re.findall(r'<tr class="([^"]+)"><td>(\d+)</td><td>(\w+)</td><td>([^<]*)</td>'
                      r'<td>(\d+)</td>.*?</tr>', table(sweep, "sweep-trials"), re.S)
    assert [(int(n), s, int(e)) for _, n, s, _, e in rows] == [
        (t.number, t.state, max(t.epochs)) for t in trials]
    assert [c for c, n, *_ in rows if "best" in c.split()] == [f"{best.state} best"]
    pruned = next(t for t in trials if t.state == "pruned")
    assert rows[pruned.number][3] == f"{pruned.value:.4f}"
    failed = next(t for t in trials if t.state == "failed")
    assert rows[failed.number][3] == "&mdash;"
    assert "&lt;script&gt;alert" in sweep and "<script" not in page
    # The plots are images beside index.html, and the page names no other file.
    drawn = sorted(p.name for p in (tmp_path / "report").glob("sweep_*.png"))
    assert drawn == ["sweep_objective.png", "sweep_params.png"]
    for name in drawn:
        width, height = png_size(tmp_path / "report" / name)
        assert width >= 600 and height >= 250
        assert f'src="{name}"' in sweep
    assert sorted(re.findall(r'src="([^"]+)"', page)) == sorted(
        ["learning_curves.png", "confusion_matrix.png", *drawn])
    # A learning rate over more than two decades is drawn on a log axis, the batch size
    # on a linear one, and a choice of strings as categories.
    scales = plot_sweep(json.loads((tmp_path / "sweep.json").read_text()), tmp_path)["scales"]
    assert scales == {"fit.learning_rate": "log", "fit.batch_size": "linear",
                      "dataset.augment": "categories"}
    # Rebuilt, the plots are the same bytes.
    before = {n: (tmp_path / "report" / n).read_bytes() for n in drawn}
    report.build_report(tmp_path)
    assert {n: (tmp_path / "report" / n).read_bytes() for n in drawn} == before


def test_a_report_without_sweep_json_has_no_sweep_section(tmp_path):
    write_records(tmp_path)
    page = report.build_report(tmp_path).read_text()
    assert 'id="sweep"' not in page and "<h2>Sweep" not in page and "trials (" not in page
    assert not list((tmp_path / "report").glob("sweep_*"))


def test_the_sweep_section_shows_each_trials_run_id_never_a_workers_run_directory(tmp_path):
    from training.sweep.record import write_sweep_json

    write_records(tmp_path)
    trials, best = sweep_records()
    write_sweep_json(tmp_path, trials, best, storage="sqlite:///runs/.sweeps/digits-mlp.db",
                     study="digits-mlp.1c561f35", objective="val_accuracy",
                     direction="maximize")
    recorded = json.loads((tmp_path / "sweep.json").read_text())
    assert recorded["best"]["run_dir"] == f"{WORKER_RUNS}/night-2-t{best.number}"  # kept
    page = report.build_report(tmp_path).read_text()
    assert f"<td>run id</td><td>night-2-t{best.number}</td>" in table(
        section(page, "sweep"), "sweep-best")
    assert WORKER_RUNS not in page and "run directory" not in page
    # A sweep.json written before the run id was kept: the id is its run_dir's last part.
    for entry in (recorded["best"], *recorded["trials"]):
        del entry["run_id"]
    (tmp_path / "sweep.json").write_text(json.dumps(recorded))
    page = report.build_report(tmp_path).read_text()
    assert f"<td>run id</td><td>night-2-t{best.number}</td>" in page
    assert WORKER_RUNS not in page


def _swept_params(space: dict, values: dict) -> tuple[list, object]:
    """Four trials over ``values`` (field -> four values), objectives rising."""
    from training.sweep.record import TrialRecord

    trials = [TrialRecord(number=n, optuna_number=n, attempt=0,
                          params={k: v[n] for k, v in values.items()}, state="complete",
                          value=0.7 + 0.05 * n, epochs={1: 0.7 + 0.05 * n}, duration_s=9.0,
                          run_dir=f"runs/night-3-t{n}", run_id=f"night-3-t{n}")
              for n in range(4)]
    return trials, trials[-1]


def _ink_at_the_sides(path: Path) -> bool:
    """Whether anything is drawn in the outer 2 pixel columns of the PNG (a title wider
    than its figure runs off both sides)."""
    from matplotlib.image import imread

    pixels = imread(path)[:, :, :3]
    return bool((pixels[:, :2] < 0.9).any() or (pixels[:, -2:] < 0.9).any())


SEARCHED = {  # learning rates within two decades: only the space says it was log-searched
    "fit.learning_rate": ({"float": [0.0003, 0.05], "log": True}, [0.0009, 0.004, 0.01, 0.04]),
    "fit.batch_size": ({"choices": [32, 64, 128]}, [128, 32, 64, 32]),
    "model.args.dropout": ({"float": [0.0, 0.5]}, [0.1, 0.2, 0.3, 0.4]),
    "model.args.image_size": ({"int": [64, 160], "step": 32}, [64, 96, 128, 160]),
    "dataset.augment": ({"choices": ["none", "flip"]}, ["flip", "none", "flip", "none"]),
}


@pytest.mark.parametrize("fields", [1, 2, 5])
def test_each_searched_value_is_drawn_as_it_was_searched_and_the_title_fits(tmp_path, fields):
    from training.report.sweep_plots import SWEEP_PARAMS, categories, plot_sweep
    from training.sweep.record import write_sweep_json

    chosen = dict(list(SEARCHED.items())[:fields])
    space = {name: spec for name, (spec, _) in chosen.items()}
    trials, best = _swept_params(space, {name: v for name, (_, v) in chosen.items()})
    write_sweep_json(tmp_path, trials, best, storage="sqlite:///s.db", study="s",
                     objective="val_accuracy", direction="maximize", space=space)
    drawn = plot_sweep(json.loads((tmp_path / "sweep.json").read_text()), tmp_path)
    expected = {"fit.learning_rate": "log", "fit.batch_size": "categories",
                "model.args.dropout": "linear", "model.args.image_size": "linear",
                "dataset.augment": "categories"}
    assert drawn["scales"] == {name: expected[name] for name in chosen}
    assert not _ink_at_the_sides(tmp_path / SWEEP_PARAMS), f"the title of {fields} field(s)"
    # Choices keep their order on the axis: 32, 64, 128, not the text's 128, 32, 64.
    assert categories([128, 32, 64], {"choices": [32, 64, 128]}) == ["32", "64", "128"]
    if fields >= 2:
        page_dir = tmp_path / "version"
        write_records(page_dir)
        (page_dir / "sweep.json").write_text((tmp_path / "sweep.json").read_text())
        searched = table(section(report.build_report(page_dir).read_text(), "sweep"),
                         "sweep-space")
        assert "<td>fit.learning_rate</td><td>0.0003 to 0.05, log scale</td>" in searched
        assert "<td>fit.batch_size</td><td>one of 32, 64, 128</td>" in searched
