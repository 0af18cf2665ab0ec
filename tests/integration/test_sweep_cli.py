"""Issue 41's promises through the CLI, for real: ``python -m training run`` with a sweep,
its trials real ``train --trial-of`` children, a real Optuna study in a real SQLite file
(or an unreachable PostgreSQL), nothing mocked.

- failed and pruned trials are recorded in the published ``sweep.json`` and the sweep
  still publishes; with ``--sweep-max-failed 0`` the same sweep fails naming them all;
- a second night with ``--sweep-continue`` runs last night's best first;
- a sweep on the JAX backend;
- SIGTERM to ``run`` stops its trials, and the same command resumes them under the same
  numbers; a trial child killed alone is recorded failed and the sweep goes on; the same
  command again after the pick trains nothing and publishes the same version;
- bad input is one ``error:`` line (exit 2) before anything is staged;
- a study storage that cannot be reached fails naming it, never its password;
- values the config refuses together fail their trial, not the sweep.

Every test shares the session's staged digits (``--staging-dir``) and works in its own
directory, as a user would, but for one sweep with failed and pruned trials
(``failing_sweep``, module-scoped) that two tests read; no test measures time (hang
guards only).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from support.cli import cli, last_json, one_error_line, streamed
from support.output import tail

from training.sweep import engine, space

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# A model of the team's own (tests/support/sweep_models.py), found on PYTHONPATH.
MODEL = ["--model", "support.sweep_models:dense"]
MODEL_ENV = {"PYTHONPATH": os.fspath(ROOT / "tests")}
QUICK = ["--backup-interval-s", "0", "--min-accuracy", "0"]
EPOCHS_TO_SPARE = 8  # the SIGTERM test's epochs (its comment)
# The model takes any dropout, and Keras refuses a rate of 1.5 when the model is built:
# those trials fail in their child, for good (exit 2). A learning rate of 1e-5 barely
# moves in an epoch: the median pruner stops it once a trial completed.
FAILING_SPACE = {"model.args.dropout": {"choices": [0.0, 1.5]},
                 "fit.learning_rate": {"choices": [0.03, 1e-5]}}
SLOW_LR, BAD_DROPOUT = 1e-5, 1.5
LR_SPACE = {"fit.learning_rate": {"float": [1e-3, 1e-1], "log": True},
            "fit.batch_size": {"choices": [32, 64]}}


def _sweep(staged, *flags: str, space_: dict = LR_SPACE, epochs: int = 2) -> list[str]:
    return ["run", "--staging-dir", staged.staging_dir, "--epochs", str(epochs), *QUICK,
            "--sweep-space", json.dumps(space_), *flags]


def _published(work: Path, stdout: str) -> tuple[dict, Path]:
    """The ``published`` line, and the version's directory in the store under ``work``."""
    published = last_json(stdout, "published")["published"]
    version = (work / "var" / "store" / "models" / published["model_name"] / "versions"
               / published["version"])
    assert version.is_dir(), version
    return published, version


def _sweep_json(version: Path) -> dict:
    return json.loads((version / "sweep.json").read_text())


def _labels(output: str, run_id: str) -> dict[int, str]:
    """Each trial's label as ``run`` logged it when the trial started (or resumed)."""
    found = re.findall(rf"trial (\d+) of run {re.escape(run_id)} \((?:new|resumed)\): (.*)",
                       output)
    return {int(n): label for n, label in found}


# --- 1. failed and pruned trials ------------------------------------------------------
def _seed_training_a_good_trial_before_the_slow_one(run_id: str) -> int:
    """A sweep seed whose grid order (the planner's, ``space.grid_points``) trains a
    trial that learns before the slow one: one trial at a time, the median pruner then
    has a completed trial to prune the slow one against."""
    params = space.parse(space.canonical(FAILING_SPACE))
    for seed in range(100):
        points = space.grid_points(params, 4, engine.trial_seed(seed, run_id, -1))
        trained = [p for p in points if p["model.args.dropout"] != BAD_DROPOUT]
        if trained[0]["fit.learning_rate"] != SLOW_LR:
            return seed
    raise AssertionError("no seed puts a trial that learns first")


@pytest.fixture(scope="module")
def failing_sweep(staged_digits, tmp_path_factory) -> SimpleNamespace:
    """One sweep, run once, that the tests below read (one runs the same command again):
    four trials one at a time on a grid where two fail to build, the slow one is pruned
    and the best is published. Its ``work`` directory, ``args``, ``seed``, ``run_id`` and
    finished process (``proc``). The module's tests are one xdist group
    (``support/order.py``: ``MODULE_GROUPS``), so it runs once a session."""
    run_id = "failing"
    seed = _seed_training_a_good_trial_before_the_slow_one(run_id)
    work = tmp_path_factory.mktemp("failing-sweep")
    args = _sweep(staged_digits, *MODEL, "--run-id", run_id, "--sweep-trials", "4",
                  "--sweep-parallel", "1", "--sweep-sampler", "grid", "--sweep-pruner",
                  "median", "--sweep-seed", str(seed), "--sweep-max-failed", "2",
                  space_=FAILING_SPACE, epochs=3)
    return SimpleNamespace(work=work, args=args, seed=seed, run_id=run_id,
                           proc=cli(work, *args, env=MODEL_ENV))


def test_failed_and_pruned_trials_are_recorded_and_the_sweep_still_publishes(
        staged_digits, failing_sweep, tmp_path):
    run_id, seed, proc = failing_sweep.run_id, failing_sweep.seed, failing_sweep.proc
    assert proc.returncode == 0, tail(proc.stderr, 80)
    published, version = _published(failing_sweep.work, proc.stdout)
    sweep = _sweep_json(version)
    trials = sweep["trials"]
    assert [t["number"] for t in trials] == list(range(4))
    by_state: dict[str, list[dict]] = {}
    for t in trials:
        by_state.setdefault(t["state"], []).append(t)
    assert set(by_state) == {"complete", "pruned", "failed"}, \
        [(t["number"], t["state"], t["params"]) for t in trials]

    # Every trial given a dropout Keras refuses failed, with the child's reason.
    failed = by_state["failed"]
    assert sorted(t["number"] for t in failed) == sorted(
        t["number"] for t in trials if t["params"]["model.args.dropout"] == BAD_DROPOUT)
    for t in failed:
        assert "failed to build" in t["error"] and "1.5" in t["error"], t
        assert t["epochs"] == {} and t["value"] is None
    # The slow one was pruned; a pruned trial stopped before the epochs the complete ran.
    assert any(t["params"]["fit.learning_rate"] == SLOW_LR for t in by_state["pruned"])
    for t in by_state["complete"]:
        assert list(t["epochs"]) == ["1", "2", "3"] and t["error"] == "", t
    for t in by_state["pruned"]:
        assert 1 <= len(t["epochs"]) < 3 and t["error"] == "", t
    assert sweep["counts"] == {"trials": 4, "complete": len(by_state["complete"]),
                               "pruned": len(by_state["pruned"]), "failed": len(failed),
                               "skipped": 0}
    # The winner is the best complete trial, and it is what was published.
    best = sweep["best"]
    assert best["value"] == min(t["value"] for t in by_state["complete"])
    assert published["version"] == f"{run_id}-t{best['number']}"
    config = json.loads((version / "config.json").read_text())
    assert config["model"]["args"]["dropout"] == best["params"]["model.args.dropout"]
    assert config["fit"]["learning_rate"] == best["params"]["fit.learning_rate"]

    # The same sweep tolerating no failure: refused (a trial completed: not "no
    # winner"), its last line naming each failed trial, its values and why, and nothing
    # published.
    strict = tmp_path / "strict"
    strict.mkdir()
    proc = cli(strict, *_sweep(
        staged_digits, *MODEL, "--run-id", "strict", "--sweep-trials", "4",
        "--sweep-parallel", "2", "--sweep-sampler", "grid", "--sweep-pruner", "median",
        "--sweep-seed", str(seed), "--sweep-max-failed", "0", space_=FAILING_SPACE,
        epochs=1), env=MODEL_ENV)
    assert proc.returncode == 1, tail(proc.stderr, 80)
    line = one_error_line(proc)
    assert proc.stderr.rstrip().endswith(line), tail(proc.stderr, 5)
    assert line.startswith("error: the sweep of run strict is refused: 2 trials failed, "
                           "more than sweep.max_failed (0) allows (4 trials: "), line
    labels = _labels(proc.stderr, "strict")
    bad = sorted(n for n, label in labels.items() if "dropout=1.5" in label)
    assert len(bad) == 2, labels
    named = line.split("; ")[1:]
    assert [x.split(" (", 1)[0] for x in named] == [f"trial {n}" for n in bad], named
    for x in named:
        assert "model.args.dropout=1.5)" in x and "failed to build" in x, x
    assert '"published"' not in proc.stdout
    assert not (strict / "var" / "store" / "models").exists()


# --- 2. a second night continues the first --------------------------------------------
def test_a_second_night_with_continue_runs_last_nights_best_first(staged_digits, tmp_path):
    nights = {}
    for night in ("night1", "night2"):
        proc = cli(tmp_path, *_sweep(
            staged_digits, "--run-id", night, "--sweep-trials", "2", "--sweep-parallel",
            "2", "--sweep-sampler", "random", "--sweep-pruner", "none", "--sweep-continue",
            epochs=1))
        assert proc.returncode == 0, tail(proc.stderr, 80)
        nights[night] = _sweep_json(_published(tmp_path, proc.stdout)[1])
    first, second = nights["night1"], nights["night2"]
    # One study, carried over from night to night.
    assert first["study"] == second["study"]
    assert ".night" not in first["study"]["name"]
    best = first["best"]
    trial0 = second["trials"][0]
    assert trial0["params"] == best["params"]
    assert trial0["continued_from"] == f"night1-t{best['number']}"
    assert second["trials"][1]["continued_from"] == ""
    assert second["trials"][1]["params"] != best["params"]
    # Night 2's record holds night 2's trials only.
    assert [t["number"] for t in second["trials"]] == [0, 1]
    assert second["counts"]["trials"] == 2
    assert all(t["run_dir"].endswith(f"night2-t{t['number']}") for t in second["trials"])
    assert not {t["optuna_number"] for t in second["trials"]} & {
        t["optuna_number"] for t in first["trials"]}
    assert all(t["continued_from"] == "" for t in first["trials"])


# --- 3. JAX ---------------------------------------------------------------------------
def test_a_sweep_trains_its_trials_on_jax_and_publishes(staged_digits, tmp_path):
    proc = cli(tmp_path, *_sweep(
        staged_digits, "--backend", "jax", "--run-id", "onjax", "--sweep-trials", "2",
        "--sweep-parallel", "2", "--sweep-sampler", "random", epochs=1))
    assert proc.returncode == 0, tail(proc.stderr, 80)
    published, version = _published(tmp_path, proc.stdout)
    sweep = _sweep_json(version)
    assert [t["number"] for t in sweep["trials"]] == [0, 1]
    for t in sweep["trials"]:
        run = json.loads((tmp_path / "runs" / f"onjax-t{t['number']}" / "model"
                          / "run.json").read_text())
        assert run["strategy"]["backend"] == "jax", t
        assert run["software"]["keras_backend"] == "jax"
        assert "tensorflow" not in run["software"]
    assert published["version"] == f"onjax-t{sweep['best']['number']}"
    assert json.loads((version / "run.json").read_text())["strategy"]["backend"] == "jax"


# --- 4. stopped and resumed -----------------------------------------------------------
def _stream(work: Path, args: list[str], on_line: Callable[[subprocess.Popen, str], None]
            | None = None, env: dict[str, str] | None = None,
            hang_guard_s: float = 300) -> tuple[int, list[str]]:
    """``python -m training ARGS`` in ``work``, stdout and stderr as one stream of lines,
    each seen by ``on_line(proc, line)`` as it comes; (exit status, lines). A process
    still running after ``hang_guard_s`` is killed: a hang fails on its status."""
    return streamed(args, cwd=work, env=env, on_line=on_line, hang_guard_s=hang_guard_s)


def _in_epoch_2(lines: list[str]) -> set[int]:
    """The trials whose child started its second epoch (the first one backed up)."""
    return {int(m.group(1)) for line in lines
            if (m := re.match(r"\[trial (\d+)\] Epoch 2/", line))}


def test_sigterm_to_run_stops_every_trial_and_the_same_command_resumes_them(
        staged_digits, tmp_path):
    # Batches of 8, one per step: an epoch lasts long enough to be stopped inside. Epochs
    # to spare: the signal waits for both trials in epoch 2, and one may start seconds
    # after the other (seen: a trial that had ended its 3 epochs by then).
    args = _sweep(staged_digits, "--run-id", "stopped", "--batch-size", "8",
                  "--steps-per-execution", "1", "--sweep-trials", "2", "--sweep-parallel",
                  "2", "--sweep-sampler", "random", "--sweep-pruner", "none",
                  "--early-stopping-patience", str(EPOCHS_TO_SPARE),
                  space_={"fit.learning_rate": {"float": [1e-3, 3e-2], "log": True}},
                  epochs=EPOCHS_TO_SPARE)
    sent: list[int] = []

    def stop_in_epoch_2(proc: subprocess.Popen, line: str) -> None:
        if not sent and _in_epoch_2([line]) and _in_epoch_2(seen) == {0, 1}:
            proc.send_signal(signal.SIGTERM)  # `run`'s pid alone: it passes it on
            sent.append(proc.pid)

    seen: list[str] = []
    code, lines = _stream(tmp_path, args, lambda p, line: (seen.append(line),
                                                            stop_in_epoch_2(p, line)))
    assert sent, tail(lines, 80)
    assert code == 143, tail(lines, 80)
    assert lines[-1] == ("error: the sweep of run stopped was stopped: run the same "
                         "command again to resume its trials"), tail(lines)
    for n in (0, 1):
        assert any(line.startswith(f"[trial {n}] ") and "exiting with status 143" in line
                   for line in lines), tail(lines, 80)
        assert (tmp_path / "runs" / f"stopped-t{n}" / "backup").is_dir()
    assert not (tmp_path / "var" / "store" / "models").exists()
    first = _labels("\n".join(lines), "stopped")

    code, lines = _stream(tmp_path, args)
    assert code == 0, tail(lines, 80)
    output = "\n".join(lines)
    # Each trial resumed under its number, with the values it drew, from its backup.
    assert re.findall(r"trial (\d+) of run stopped \((new|resumed)\)", output) in (
        [("0", "resumed"), ("1", "resumed")], [("1", "resumed"), ("0", "resumed")])
    assert _labels(output, "stopped") == first
    for n in (0, 1):
        restored = [line for line in lines
                    if line.startswith(f"[trial {n}] ") and "resume state restored:" in line]
        assert len(restored) == 1, tail(lines, 80)
        assert not [line for line in lines if line.startswith(f"[trial {n}] Epoch 1/")]
        assert not (tmp_path / "runs" / f"stopped-t{n}" / "backup").exists()
    _, version = _published(tmp_path, "\n".join(line for line in lines
                                                 if line.startswith("{")))
    sweep = _sweep_json(version)
    assert [(t["number"], t["attempt"], t["state"]) for t in sweep["trials"]] == [
        (0, 0, "complete"), (1, 0, "complete")]
    for t in sweep["trials"]:
        assert list(t["epochs"]) == [str(e) for e in range(1, EPOCHS_TO_SPARE + 1)], t
        assert t["run_dir"].endswith(f"stopped-t{t['number']}")
        assert t["error"] == "", t  # stopped, then resumed: nothing went wrong


def _trial_child(run: subprocess.Popen, slot: int) -> psutil.Process:
    """The ``train --trial-of BASE --trial SLOT`` child of ``run``."""
    for child in psutil.Process(run.pid).children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "--trial-of" in argv and argv[argv.index("--trial") + 1] == str(slot):
            return child
    raise AssertionError(f"no child of run {run.pid} trains trial {slot}")


def test_a_trial_child_killed_alone_is_recorded_failed_and_the_sweep_goes_on(
        staged_digits, tmp_path):
    # Two trials, one learning and one that barely moves: the one killed is the one
    # that learns, so the sweep first goes on with the other and the retry then wins.
    args = _sweep(staged_digits, "--run-id", "killed", "--batch-size", "8",
                  "--steps-per-execution", "1", "--sweep-trials", "2", "--sweep-parallel",
                  "2", "--sweep-sampler", "grid", "--sweep-pruner", "none",
                  "--sweep-max-failed", "1",
                  space_={"fit.learning_rate": {"choices": [0.03, 1e-4]}}, epochs=2)
    killed: list[int] = []

    def kill_the_learner_in_epoch_2(proc: subprocess.Popen, line: str) -> None:
        learner = [n for n, label in _labels("\n".join(seen), "killed").items()
                   if "learning_rate=0.03" in label]
        if not killed and learner and line.startswith(f"[trial {learner[0]}] Epoch 2/"):
            child = _trial_child(proc, learner[0])
            killed.append(learner[0])
            child.kill()  # SIGKILL mid-epoch: no backup of its own, epoch 1's stays

    seen: list[str] = []
    code, lines = _stream(tmp_path, args, lambda p, line: (
        seen.append(line), kill_the_learner_in_epoch_2(p, line)))
    assert killed, tail(lines, 80)
    (slot,) = killed
    other = 1 - slot
    # The sweep went on without it: the other trial won, the killed one is recorded
    # failed, with why.
    assert code == 0, tail(lines, 80)
    published, version = _published(tmp_path, "\n".join(line for line in lines
                                                          if line.startswith("{")))
    assert published["version"] == f"killed-t{other}"
    sweep = _sweep_json(version)
    states = {t["number"]: (t["attempt"], t["state"]) for t in sweep["trials"]}
    assert states == {other: (0, "complete"), slot: (0, "failed")}, states
    failed = sweep["trials"][slot]
    assert failed["error"] == ("training exited with code -9: no error line; see the log "
                               "above"), failed
    assert list(failed["epochs"]) == ["1"], failed
    assert sweep["counts"] == {"trials": 2, "complete": 1, "pruned": 0, "failed": 1,
                               "skipped": 0}
    assert (tmp_path / "runs" / f"killed-t{slot}" / "backup").is_dir()

    # The same command again: the sweep was picked, so it is done, as a finished run is:
    # no trial trains again, and the same version is published (the same bytes).
    code, lines = _stream(tmp_path, args)
    assert code == 0, tail(lines, 80)
    assert "the sweep was picked already" in "\n".join(lines), tail(lines, 80)
    assert not [line for line in lines if line.startswith("[trial ")], tail(lines, 80)
    again, version = _published(tmp_path, "\n".join(line for line in lines
                                                     if line.startswith("{")))
    assert again["version"] == f"killed-t{other}"
    assert _sweep_json(version) == sweep


# --- what these tests found, fixed -----------------------------------------------------
def test_values_the_config_refuses_together_fail_their_trial_or_the_space(
        staged_digits, tmp_path):
    # model.unfreeze_layers above 0 needs model.freeze_epochs above 0 (the base's is 0):
    # either the space is refused before anything is staged, or the trial that drew 5
    # fails with that reason and the sweep goes on.
    proc = cli(tmp_path, *_sweep(
        staged_digits, "--run-id", "together", "--sweep-trials", "2", "--sweep-parallel",
        "2", "--sweep-sampler", "grid", "--sweep-max-failed", "1",
        space_={"model.unfreeze_layers": {"choices": [0, 5]}}, epochs=1))
    if proc.returncode == 2:
        assert "model.unfreeze_layers" in one_error_line(proc)
        assert '"staged"' not in proc.stdout, tail(proc.stderr, 40)
        return
    assert proc.returncode == 0, tail(proc.stderr, 40)
    sweep = _sweep_json(_published(tmp_path, proc.stdout)[1])
    (refused,) = [t for t in sweep["trials"] if t["params"]["model.unfreeze_layers"] == 5]
    assert refused["state"] == "failed"
    assert "model.unfreeze_layers is 5 but model.freeze_epochs is 0" in refused["error"]


def test_the_same_command_again_after_a_published_sweep_with_a_failure_succeeds(
        failing_sweep):
    # The module's sweep was published with two trials failed (and one pruned): the same
    # command again succeeds, trains nothing and publishes the same version, unchanged.
    first = failing_sweep.proc
    assert first.returncode == 0, tail(first.stderr, 40)
    published, version = _published(failing_sweep.work, first.stdout)
    sweep = _sweep_json(version)
    assert sweep["counts"]["failed"] == 2, sweep["counts"]
    again = cli(failing_sweep.work, *failing_sweep.args, env=MODEL_ENV)
    assert again.returncode == 0, tail(again.stderr, 40)
    said = again.stdout + again.stderr
    assert "the sweep was picked already" in said, tail(again.stderr, 40)
    assert not re.findall(r"^\[trial \d+\] ", said, flags=re.M), tail(again.stderr, 40)
    assert last_json(again.stdout, "published")["published"]["version"] == \
        published["version"]
    assert _sweep_json(version) == sweep


# --- 5. bad input ---------------------------------------------------------------------
def _space(entry: dict) -> list[str]:
    return ["--sweep-space", json.dumps(entry)]


BAD_INPUT = {
    "unknown field": (["--sweep-trials", "4", *_space(
        {"fit.learnig_rate": {"float": [1e-3, 0.1]}})],
        ["sweep.space", "'fit.learnig_rate'", "did you mean 'fit.learning_rate'"]),
    "refused field": (["--sweep-trials", "4", *_space(
        {"dataset.name": {"choices": ["mnist", "digits"]}})],
        ["dataset.name cannot be searched", "which data the trials train"]),
    "wrong distribution": (["--sweep-trials", "4", *_space(
        {"fit.epochs": {"float": [1.0, 5.0]}})],
        ["sweep.space['fit.epochs']", "{'float': [1.0, 5.0]}", "integer",
         "it takes 'int' or 'choices'"]),
    "inverted bounds": (["--sweep-trials", "4", *_space(
        {"fit.learning_rate": {"float": [0.1, 0.001]}})],
        ["sweep.space['fit.learning_rate']", "[0.1, 0.001]", "low below high"]),
    "log from 0": (["--sweep-trials", "4", *_space(
        {"fit.min_lr": {"float": [0.0, 0.1], "log": True}})],
        ["sweep.space['fit.min_lr']", "log-scaled range must start above 0", "low 0"]),
    "one choice": (["--sweep-trials", "4", *_space({"fit.batch_size": {"choices": [64]}})],
                   ["sweep.space['fit.batch_size']", "at least two values", "[64]"]),
    "parallel above trials": (["--sweep-trials", "2", "--sweep-parallel", "3", *_space(
        {"fit.epochs": {"int": [1, 5]}})],
        ["sweep.parallel must be at most sweep.trials (2), got 3"]),
    "grid over a float": (["--sweep-trials", "4", "--sweep-sampler", "grid", *_space(
        {"fit.learning_rate": {"float": [0.001, 0.1]}})],
        ["sweep.space['fit.learning_rate']", "float range", "sweep.sampler is 'grid'"]),
    "trials above the cap": (["--sweep-trials", "1001", *_space(
        {"fit.epochs": {"int": [1, 5]}})],
        ["sweep.trials must be between 0 and 1000, got 1001"]),
}


def _as_config_file(flags: list[str], path: Path) -> list[str]:
    """The same settings as a JSON config file (the space as an object), ``--config``."""
    sweep, i = {}, 0
    keys = {"--sweep-trials": "trials", "--sweep-parallel": "parallel",
            "--sweep-sampler": "sampler", "--sweep-space": "space"}
    while i < len(flags):
        key, value = keys[flags[i]], flags[i + 1]
        sweep[key] = (json.loads(value) if key == "space" else
                      int(value) if key in ("trials", "parallel") else value)
        i += 2
    path.write_text(json.dumps({"sweep": sweep}))
    return ["--config", os.fspath(path)]


@pytest.mark.parametrize("source", ["flags", "file"])
@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_sweep_input_is_one_error_before_anything_is_staged(tmp_path, case, source):
    flags, expected = BAD_INPUT[case]
    work = tmp_path / "work"
    work.mkdir()
    if source == "file":
        flags = _as_config_file(flags, tmp_path / "config.json")
    proc = cli(work, "run", "--epochs", "1", *flags, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc)
    for text in expected:
        assert text in line, line
    assert sorted(p.name for p in work.iterdir()) == []  # no var/, no runs/
    assert '"staged"' not in proc.stdout


# --- 6. an unreachable storage --------------------------------------------------------
@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers (a database that hangs)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


@pytest.mark.parametrize("port", ["closed", "silent"])
def test_a_storage_that_cannot_be_reached_fails_naming_it_without_its_password(
        staged_digits, tmp_path, request, port):
    number = _closed_port() if port == "closed" else request.getfixturevalue("silent_server")
    storage = f"postgresql+psycopg2://trainer@127.0.0.1:{number}/optuna"
    proc = cli(tmp_path, *_sweep(staged_digits, "--sweep-trials", "2", "--sweep-storage",
                                 storage),
               env={"TRAINING_SWEEP_STORAGE_PASSWORD": "s3cret"}, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = one_error_line(proc)
    assert line.startswith(f"error: the sweep's study storage {storage} cannot be opened"), line
    assert "s3cret" not in proc.stdout + proc.stderr
    assert '"published"' not in proc.stdout and not (tmp_path / "runs").exists()
