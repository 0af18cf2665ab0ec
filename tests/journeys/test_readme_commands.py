"""Journeys: the README's ``./dev`` commands, run exactly as written, from a fresh clone.

One copy of the tree as a clone of it would be (``support/fresh.py``), one environment
as a new user's shell has it, and each command typed as the README types it. ``./dev
airflow`` is walked in a browser by ``tests/system/test_journey.py``; ``./dev test`` is
what CI runs around all of this. A README that gains a ``./dev`` command without a test
here fails ``test_every_dev_command_of_the_readme_is_run_here``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from support.browser import browser as browser  # the fixture
from support.fresh import REPO, fresh_copy, new_user_env

pytestmark = pytest.mark.slow

DEMO = "./dev demo"
DEMO_WITH_CONF = """./dev demo '{"model": "cnn", "epochs": 3}'"""
DEMO_ON_JAX = """./dev demo '{"backend": "jax", "model_name": "digits-mlp-jax"}'"""
DEMO_SWEEP = ("""./dev demo '{"model_name": "digits-swept", "epochs": 4, "sweep_trials": 4, """
              """"sweep_parallel": 2, "sweep_space": {"fit.learning_rate": {"float": """
              """[0.0003, 0.03], "log": true}}}'""")
CLI_SWEEP = ("""./dev cli run --model-name digits-swept-cli --epochs 3 --sweep-trials 4 """
             """--sweep-parallel 2 --sweep-space '{"fit.learning_rate": {"float": [0.0001, """
             """0.1], "log": true}, "fit.batch_size": {"choices": [32, 64]}}'""")
CLI_HELP = "./dev cli run --help"
MLFLOW_UI = "./dev mlflow"
DAG_CHECKS = './dev test tests/dags -m "not slow" -n 0'
TENSORBOARD = ".venv/bin/tensorboard --logdir var/store/models/digits-mlp/versions --port 6006"
# Run elsewhere: ./dev test is CI itself; ./dev airflow is the system journey, ./dev stack
# the deployment tests' stack (tests/deploy), ./dev images the image tests' fixture
# (tests/deploy/images/conftest.py).
ELSEWHERE = {"./dev test", "./dev airflow", "./dev stack", "./dev images"}


def night_by_night() -> list[str]:
    """The lines of the night-by-night block (docs/datasets.md), in order."""
    section = (REPO / "docs" / "datasets.md").read_text().split("### Night by night", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def readme_commands() -> set[str]:
    """Every command line in the bash blocks of the README and of docs/, without its
    comment."""
    commands = set()
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.add(line)
    return commands


def sh(clone: Path, command: str, timeout: float) -> subprocess.CompletedProcess:
    """``command`` as a person types it into a shell at the clone's root."""
    return subprocess.run(["bash", "-c", command], cwd=clone, env=new_user_env(),
                          capture_output=True, text=True, timeout=timeout)


def summary(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)  # the demo's last word: the run's summary, as JSON


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_copy(tmp_path_factory.mktemp("readme") / "clone")


def test_every_dev_command_of_the_readme_is_run_here():
    tested = {DEMO, DEMO_WITH_CONF, DEMO_ON_JAX, DEMO_SWEEP, CLI_SWEEP, CLI_HELP, DAG_CHECKS,
              TENSORBOARD, MLFLOW_UI, *ELSEWHERE, *night_by_night()}
    written = {c for c in readme_commands() if c.startswith(("./dev", ".venv/bin/tensorboard"))}
    assert written <= tested, f"README commands no test runs: {sorted(written - tested)}"
    assert {DEMO, CLI_HELP, DAG_CHECKS, TENSORBOARD, *ELSEWHERE} <= written


def test_demo_runs_the_dag_end_to_end(clone: Path):
    first = summary(sh(clone, DEMO, timeout=900))
    assert first["state"] == "success", first
    # Every task succeeded; `trial` (a sweep's) had nothing to map over and was skipped.
    ran = {task for task in first["tasks"] if task != "trial"}
    assert first["tasks"] == {**dict.fromkeys(ran, "success"), "trial": "skipped"}, first
    assert first["promoted"] is True and first["champion"] is None, first
    assert first["metrics"]["accuracy"] >= 0.9, first
    assert first["store_uri"] == str(clone / "var" / "store")
    assert any("no model in production" in r for r in first["decision"]["reasons"]), first
    # No task loaded TensorFlow (all ran in the `dags test` process): the training
    # process staged nothing, trained and evaluated; each task logged its timing.
    run = clone / "var" / "runs" / first["published_version"] / "airflow"
    assert {p.stem: json.loads(p.read_text())["heavy_modules"] for p in run.glob("*.json")
            } == {task: [] for task in ran}
    assert set(first["timing"]) == ran, first["timing"]
    # "Run it again: nothing is new" is the same check as night 2 of the night-by-night
    # walk-through below, and tests/dags/test_dag_run.py runs it on digits.


def test_demo_with_a_conf_trains_what_it_says(clone: Path):
    done = summary(sh(clone, DEMO_WITH_CONF, timeout=900))
    assert done["state"] == "success", done
    assert done["model_name"] == "digits-cnn", done
    config = json.loads((clone / "var" / "store" / "models" / "digits-cnn" / "versions"
                         / done["published_version"] / "config.json").read_text())
    assert (config["model"]["name"], config["fit"]["epochs"]) == ("cnn", 3)


def test_demo_on_jax_trains_there_and_promotes(clone: Path):
    done = summary(sh(clone, DEMO_ON_JAX, timeout=900))
    assert done["state"] == "success" and done["promoted"] is True, done
    assert done["model_name"] == "digits-mlp-jax" and done["metrics"]["accuracy"] >= 0.9
    run = json.loads((clone / "var" / "store" / "models" / "digits-mlp-jax" / "versions"
                      / done["published_version"] / "run.json").read_text())
    assert run["strategy"]["backend"] == "jax", run["strategy"]
    assert run["software"]["keras_backend"] == "jax" and "tensorflow" not in run["software"]
    assert (clone / "var" / "store" / "models" / "digits-mlp-jax" / "versions"
            / done["published_version"] / "saved_model" / "saved_model.pb").is_file()


def test_demo_with_a_sweep_runs_its_trials_as_tasks_and_promotes_the_best(clone: Path):
    done = summary(sh(clone, DEMO_SWEEP, timeout=900))
    assert done["state"] == "success" and done["promoted"] is True, done
    assert done["model_name"] == "digits-swept", done
    trials = {t: s for t, s in done["tasks"].items() if t.startswith("trial[")}
    assert trials == {f"trial[{i}]": "success" for i in range(4)}, done["tasks"]
    version = clone / "var" / "store" / "models" / "digits-swept" / "versions" / done[
        "published_version"]
    sweep = json.loads((version / "sweep.json").read_text())
    assert sweep["counts"]["trials"] == 4 and done["published_version"].endswith(
        f"-t{sweep['best']['number']}")
    assert (version / "report" / "sweep_objective.png").is_file()


def _mlflow_api(path: str, **query: str) -> dict:
    url = f"http://127.0.0.1:5000/api/2.0/mlflow/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def _search(experiment_id: str) -> list[dict]:
    request = urllib.request.Request(
        "http://127.0.0.1:5000/api/2.0/mlflow/runs/search",
        data=json.dumps({"experiment_ids": [experiment_id], "max_results": 100}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read()).get("runs", [])


def test_mlflow_shows_the_demos_runs_the_sweep_and_the_champion(clone: Path, browser):
    """``./dev mlflow`` as written, after the demos: every demo run is an MLflow run, the
    sweep a parent with its 4 trials as children, each model's champion its production;
    then the UI walked in Chromium (the screenshots are looked at, issue 46)."""
    from support.airflow_ui import artifacts_dir

    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 5000)) == 0:
            pytest.skip("port 5000 is taken on this machine")
    server = subprocess.Popen(["bash", "-c", f"exec {MLFLOW_UI}"], cwd=clone,
                              env=new_user_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180  # a hang guard: a new store migrates first
        while time.monotonic() < deadline and server.poll() is None:
            with contextlib.suppress(OSError), urllib.request.urlopen(
                    "http://127.0.0.1:5000/health", timeout=5):
                break
            time.sleep(1.0)
        swept = _mlflow_api("experiments/get-by-name", experiment_name="digits-swept")
        runs = _search(swept["experiment"]["experiment_id"])
        tags = [{t["key"]: t["value"] for t in run["data"].get("tags", [])} for run in runs]
        parents = [t for t in tags if "mlflow.parentRunId" not in t]
        assert len(parents) == 1 and parents[0]["airflow.dag_id"] == "keras_retrain", tags
        children = [t for t in tags if "mlflow.parentRunId" in t]
        assert sorted(t["pipeline.run_id"][-3:] for t in children) == [
            "-t0", "-t1", "-t2", "-t3"], tags
        champion = _mlflow_api("registered-models/alias", name="digits-swept",
                               alias="champion")["model_version"]
        production = json.loads((clone / "var" / "store" / "models" / "digits-swept" /
                                 "production.json").read_text())["version"]
        assert {t["key"]: t["value"] for t in champion["tags"]}["pipeline.version"] \
            == production
        plain = _mlflow_api("experiments/get-by-name", experiment_name="digits-mlp")
        assert _search(plain["experiment"]["experiment_id"])
        # The UI, as a person opens it: the sweep's runs, then the registered model.
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto("http://127.0.0.1:5000/#/experiments/"
                  f"{swept['experiment']['experiment_id']}/runs")
        page.get_by_text(parents[0]["pipeline.run_id"]).first.wait_for()
        # The parent's row opens on its children: the sweep's trials.
        page.locator("button[data-component-id*='runnamecellrenderer']").first.click()
        for child in children:
            page.get_by_text(child["pipeline.run_id"]).first.wait_for()
        page.screenshot(path=str(artifacts_dir() / "mlflow-sweep-runs.png"), full_page=True)
        page.goto("http://127.0.0.1:5000/#/models/digits-swept")
        page.get_by_text("champion").first.wait_for()
        page.screenshot(path=str(artifacts_dir() / "mlflow-registered-model.png"),
                        full_page=True)
        page.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_a_sweep_from_the_cli_publishes_its_best_trial(clone: Path):
    done = sh(clone, CLI_SWEEP, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    published = [json.loads(line)["published"] for line in done.stdout.splitlines()
                 if line.startswith('{"published"')]
    assert published and published[0]["model_name"] == "digits-swept-cli", done.stdout
    sweep = json.loads((clone / "var" / "store" / "models" / "digits-swept-cli" / "versions"
                        / published[0]["version"] / "sweep.json").read_text())
    assert [t["number"] for t in sweep["trials"]] == [0, 1, 2, 3]


def test_cli_help_lists_the_config_flags(clone: Path):
    done = sh(clone, CLI_HELP, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for flag in ("--epochs", "--batch-size", "--strategy", "--model-name", "--config"):
        assert flag in done.stdout, flag


def test_the_dag_checks_a_team_puts_in_its_ci(clone: Path):
    done = sh(clone, DAG_CHECKS, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert re.search(r"\d+ passed", done.stdout), done.stdout[-2000:]


def test_tensorboard_serves_the_published_versions(clone: Path):
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 6006)) == 0:
            pytest.skip("port 6006 is taken on this machine")
    versions = sorted(p.name for p in
                      (clone / "var" / "store" / "models" / "digits-mlp" / "versions").iterdir())
    assert versions, "run the demo first (test order)"
    server = subprocess.Popen(["bash", "-c", f"exec {TENSORBOARD}"], cwd=clone,
                              env=new_user_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        runs, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen("http://127.0.0.1:6006/data/runs", timeout=5) as r:
                    runs = json.loads(r.read())
                if {f"{v}/tensorboard/train" for v in versions} <= set(runs):
                    break
            time.sleep(1.0)
        assert {f"{v}/tensorboard/train" for v in versions} <= set(runs), runs
        assert {f"{v}/tensorboard/validation" for v in versions} <= set(runs), runs
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_night_by_night_the_demo_grows_skips_promotes_and_refuses_drift(clone: Path):
    """The README's night-by-night block, line by line, each night checked in the store."""
    store = clone / "var" / "store" / "models" / "team_digits-mlp"
    lines = night_by_night()
    assert len(lines) == 8 and lines[2].startswith(DEMO), lines
    done = sh(clone, lines[0], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads(done.stdout)
    assert [p["drifted"] for p in written["partitions"]] == [False, False, True]
    assert written["holdout"]["files"] == 180
    assert json.loads(sh(clone, lines[1], timeout=300).stdout)["landed"] is True

    def version_file(version: str, name: str) -> str:
        return (store / "versions" / version / name).read_text()

    # Night 1: the 28th alone; nothing in production, so the first model is promoted.
    first = summary(sh(clone, lines[2], timeout=900))
    assert first["promoted"] is True and first["model_name"] == "team_digits-mlp", first
    v1 = first["published_version"]
    evaluation = json.loads(version_file(v1, "evaluation.json"))
    assert evaluation["holdout"]["examples"] == 180, evaluation["holdout"]
    assert evaluation["holdout"]["champion"] is None
    stats = json.loads(version_file(v1, "data_stats.json"))
    assert list(stats["statistics"]["partitions"]) == ["dt=2026-11-28"]

    # Night 2: nothing landed for the 29th: the same snapshot, so no training.
    second = summary(sh(clone, lines[3], timeout=900))
    assert second["tasks"]["train"] == "skipped", second
    assert second["skipped_because"].startswith(
        f"nothing new: production (team_digits-mlp {v1}) was trained on this data"), second

    # Night 3: both days; better on the same, current test split: promoted.
    assert json.loads(sh(clone, lines[4], timeout=300).stdout)["landed"] is True
    third = summary(sh(clone, lines[5], timeout=900))
    assert third["promoted"] is True and third["champion"]["version"] == v1, third
    v3 = third["published_version"]
    evaluation = json.loads(version_file(v3, "evaluation.json"))
    holdout = evaluation["holdout"]
    assert holdout["champion"]["version"] == v1 and holdout["examples"] == 180, holdout
    assert holdout["fingerprint"] == json.loads(
        version_file(v1, "evaluation.json"))["holdout"]["fingerprint"]  # the same images
    assert evaluation["challenger"]["examples"] > evaluation["holdout"]["examples"]
    report = version_file(v3, "report/index.html")
    for table in ("holdout", "data-checks", "data-splits", "data-classes"):
        assert f'<table class="{table}">' in report, table
    assert "<td>drift</td><td>passed</td>" in report

    # Night 4: the drifted 30th is refused before training, with its reasons.
    assert json.loads(sh(clone, lines[6], timeout=300).stdout)["landed"] is True
    fourth = sh(clone, lines[7], timeout=900)
    assert fourth.returncode != 0, fourth.stdout[-2000:]
    assert "data check drift: FAILED (dt=2026-11-30: label distribution moved by" \
        in fourth.stderr, fourth.stderr[-3000:]
    assert "dt=2026-11-30: pixel mean moved by" in fourth.stderr, fourth.stderr[-3000:]
    assert sorted(p.name for p in (store / "versions").iterdir()) == sorted([v1, v3])
    assert json.loads((store / "production.json").read_text())["version"] == v3
