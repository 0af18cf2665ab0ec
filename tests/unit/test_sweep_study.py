"""The sweep's study through ask-and-tell, with real Optuna on a real SQLite file: slots
planned once, a retried task finds its own trial again (several processes asking at
once included), failures recorded, continued sweeps kept apart by run id and data
fingerprint, the budget, the pick and sweep.json."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import re
import time
from datetime import UTC, datetime, timedelta

import optuna
import pytest

from training.config.run import RunConfig
from training.errors import LaunchError, StorageError, SweepRefused
from training.sweep import study as sweeps
from training.sweep.pick import pick
from training.sweep.record import write_sweep_json
from training.sweep.storage import SWEEPS_DIR, open_storage, storage_url

SPACE = {"fit.learning_rate": {"float": [1e-4, 1e-1], "log": True},
         "fit.batch_size": {"choices": [32, 64, 128]},
         "fit.epochs": {"int": [2, 6]}}


def swept(output_dir, run_id="night-1", monitor="val_loss", **sweep) -> RunConfig:
    sections = {"storage": {"output_dir": str(output_dir), "run_id": run_id},
                "fit": {"early_stopping_monitor": monitor, "epochs": 6}}
    sweep = {"trials": 4, "sampler": "random", "space": SPACE, **sweep}
    return RunConfig.from_dict({**sections, "sweep": sweep})


def finish(sweep, slot, values, state="complete"):
    handle = sweeps.ask(sweep, slot)
    for step, value in enumerate(values, 1):
        handle.report(value, step)
    return sweeps.tell(handle, state, reason="boom" if state == "failed" else "")


def test_the_study_lives_in_a_sqlite_file_under_the_runs_directory(tmp_path):
    cfg = swept(tmp_path / "runs")
    sweep = sweeps.open_study(cfg, "data-1")
    db = tmp_path / "runs" / SWEEPS_DIR / "digits-mlp.db"
    assert sweep.url == f"sqlite:///{db}" and db.is_file()
    assert sweep.study.study_name.startswith("digits-mlp.") and \
        sweep.study.study_name.endswith(".night-1")
    assert sweep.study.direction == optuna.study.StudyDirection.MINIMIZE
    again = sweeps.open_study(cfg, "data-1")  # load, not create
    assert again.study.study_name == sweep.study.study_name
    assert sweeps.open_study(swept(tmp_path / "runs", monitor="val_accuracy"), "d") \
        .study.direction == optuna.study.StudyDirection.MAXIMIZE


def test_slots_are_planned_once_and_a_retry_finds_its_own_trial(tmp_path):
    sweep = sweeps.open_study(swept(tmp_path), "data-1")
    assert sweeps.plan(sweep) == [0, 1, 2, 3]
    assert sweeps.plan(sweep) == []  # a re-run of the planning step adds nothing
    first = sweeps.ask(sweep, 2)
    assert first.state == "new"
    assert set(first.params) == set(SPACE)
    assert 1e-4 <= first.params["fit.learning_rate"] <= 0.1
    assert first.params["fit.batch_size"] in (32, 64, 128)
    # A retried task, in a new process: a new study object, the same trial and values.
    retry = sweeps.ask(sweeps.open_study(swept(tmp_path), "data-1"), 2)
    assert retry.state == "running" and retry.params == first.params
    assert retry.trial.number == first.trial.number
    others = [sweeps.ask(sweep, slot).params for slot in (0, 1, 3)]
    assert len({json.dumps(p, sort_keys=True) for p in [first.params, *others]}) == 4
    with pytest.raises(ValueError, match="slot must be between 0 and 3, got 4"):
        sweeps.ask(sweep, 4)


def _ask_in_a_process(job):
    output_dir, slot = job
    sweep = sweeps.open_study(swept(output_dir), "data-1")
    handle = sweeps.ask(sweep, slot)
    return slot, handle.state, handle.trial.number, handle.params


def test_processes_asking_at_once_each_get_their_slot_and_one_trial_per_slot(tmp_path):
    sweeps.plan(sweeps.open_study(swept(tmp_path), "data-1"))
    jobs = [(str(tmp_path), slot) for slot in (0, 1, 2, 3, 1, 1)]
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        answers = pool.map(_ask_in_a_process, jobs)
    by_slot: dict[int, set] = {}
    for slot, state, number, params in answers:
        by_slot.setdefault(slot, set()).add((number, json.dumps(params, sort_keys=True)))
        assert state in ("new", "running")
    assert all(len(found) == 1 for found in by_slot.values()), answers  # one trial a slot
    assert len({next(iter(found))[0] for found in by_slot.values()}) == 4
    assert [state for slot, state, *_ in answers if slot == 1].count("new") == 1
    assert len(sweeps.open_study(swept(tmp_path), "data-1").study.trials) == 4


def _trial_in_a_lane(job):
    """A trial task: claim its slot within the lanes, "train" a moment, tell; when."""
    import time

    output_dir, slot = job
    sweep = sweeps.open_study(swept(output_dir, parallel=2), "data-1")
    handle = sweeps.ask(sweep, slot, lanes=2)
    began = time.time()
    time.sleep(1.5)
    handle.report(0.5, 1)
    sweeps.tell(handle, "complete")
    return slot, began, time.time()


def test_trials_started_in_any_order_train_at_most_parallel_at_once_and_all_end(tmp_path):
    # Airflow may start the mapped trials in any order, all at once: the last slots first
    # here. A trial waits for any lane, never for a given trial, so none waits forever.
    sweeps.plan(sweeps.open_study(swept(tmp_path, parallel=2), "data-1"))
    jobs = [(str(tmp_path), slot) for slot in (3, 2, 1, 0)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        spans = pool.map(_trial_in_a_lane, jobs)
    assert sorted(slot for slot, *_ in spans) == [0, 1, 2, 3]
    events = sorted([(began, 1) for _, began, _ in spans] + [(end, -1) for *_, end in spans],
                    key=lambda e: (e[0], e[1]))
    training = most = 0
    for _, step in events:
        training += step
        most = max(most, training)
    assert most == 2, spans  # two at once, never three
    records = sweeps.close(sweeps.open_study(swept(tmp_path, parallel=2), "data-1"))
    assert [r.state for r in records] == ["complete"] * 4


def test_tell_complete_pruned_failed_and_a_failure_a_retry_may_fix(tmp_path):
    sweep = sweeps.open_study(swept(tmp_path, max_failed=1), "data-1")
    sweeps.plan(sweep)
    assert finish(sweep, 0, [0.9, 0.5, 0.7]) == "complete"
    assert sweep.current(0).value == 0.5  # the best epoch: restore_best_weights
    assert sweeps.ask(sweep, 0).state == "complete"  # a re-run trains nothing
    assert finish(sweep, 1, [1.2], state="pruned") == "pruned"
    handle = sweeps.ask(sweep, 2)
    assert sweeps.tell(handle, "failed", reason="OOM", final=False) == "running"
    retry = sweeps.ask(sweep, 2)  # Airflow's retry: the same trial, still running
    assert retry.state == "running" and retry.trial.number == handle.trial.number
    assert sweeps.tell(retry, "failed", reason="OOM again") == "failed"
    rerun = sweeps.ask(sweep, 2)  # cleared and run again: a new attempt, the same values
    assert rerun.state == "new" and rerun.params == handle.params
    assert rerun.trial.number != handle.trial.number
    assert sweeps.tell(rerun, "complete", value=0.4) == "complete"
    assert sweeps.tell(rerun, "failed", reason="late") == "complete"  # told once
    trials = sweeps.close(sweep)  # slot 3 never ran
    assert [t.state for t in trials] == ["complete", "pruned", "complete", "failed"]
    assert trials[2].attempt == 1 and trials[2].value == 0.4
    assert trials[3].error == "never started: its trial task did not run"
    assert trials[0].epochs == {1: 0.9, 2: 0.5, 3: 0.7}
    assert trials[1].value == 1.2  # a pruned trial keeps its last report
    assert all(t.data_fingerprint == "data-1" for t in trials)
    assert trials[2].run_dir == str(tmp_path / "night-1-t2")
    best = pick(trials, sweep.cfg)
    assert (best.number, best.value) == (2, 0.4)


def test_the_pick_names_every_failure_when_none_completed_or_too_many_failed(tmp_path):
    sweep = sweeps.open_study(swept(tmp_path, max_failed=1), "data-1")
    sweeps.plan(sweep)
    finish(sweep, 0, [0.3], state="failed")
    finish(sweep, 1, [0.3], state="pruned")
    finish(sweep, 2, [0.3])
    trials = sweeps.close(sweep)  # slot 3 never ran
    with pytest.raises(SweepRefused) as err:
        pick(trials, sweep.cfg)
    # One line, the one a command ends with: a trial completed, so no "no winner"; each
    # failed trial with its values and its reason.
    message = str(err.value)
    assert "\n" not in message and "no winner" not in message
    assert message.startswith(
        "the sweep of run night-1 is refused: 2 trials failed, more than "
        "sweep.max_failed (1) allows (4 trials: 1 complete, 1 pruned, 2 failed, 0 skipped); "
        "trial 0 ("), message
    values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in sorted(trials[0].params.items()))
    assert f"; trial 0 ({values}) failed: boom; " in message, message
    # A trial that never started drew no values.
    assert message.endswith("; trial 3 failed: never started: its trial task did not run")
    lenient = dataclasses.replace(
        sweep.cfg, sweep=dataclasses.replace(sweep.cfg.sweep, max_failed=2))
    assert pick(trials, lenient).number == 2
    none = sweeps.open_study(swept(tmp_path, "night-2", max_failed=4), "data-1")
    finish(none, 0, [0.3], state="pruned")
    with pytest.raises(LaunchError, match="night-2 has no winner: no trial completed"):
        pick(sweeps.close(none), none.cfg)


def test_the_pick_says_1_trial_and_cuts_many_failures_to_the_first_few(tmp_path):
    one = sweeps.open_study(swept(tmp_path, "night-1", trials=2), "data-1")
    sweeps.plan(one)
    finish(one, 0, [0.3])
    finish(one, 1, [0.3], state="failed")
    with pytest.raises(SweepRefused, match=r"is refused: 1 trial failed, more than "
                                           r"sweep\.max_failed \(0\) allows \(2 trials: "):
        pick(sweeps.close(one), one.cfg)
    many = sweeps.open_study(swept(tmp_path, "night-2", trials=8), "data-1")
    sweeps.plan(many)
    for slot in range(8):
        handle = sweeps.ask(many, slot)
        sweeps.tell(handle, "failed", reason=f"reason {slot} " + "x" * 500)
    with pytest.raises(SweepRefused) as err:
        pick(sweeps.close(many), many.cfg)
    message = str(err.value)
    assert message.startswith("the sweep of run night-2 has no winner: no trial completed "
                              "(8 trials: 0 complete, 0 pruned, 8 failed, 0 skipped); ")
    assert [int(n) for n in re.findall(r"trial (\d+) \(", message)] == [0, 1, 2]
    assert message.endswith("; and 5 more failed trials")
    assert len(message) < 1600  # each reason cut
    assert "reason 2 xxx" in message and "x" * 400 not in message


def test_a_continued_sweep_starts_from_the_previous_best_and_keeps_nights_apart(tmp_path):
    first = sweeps.open_study(swept(tmp_path, "night-1", continue_previous=True), "data-1")
    sweeps.plan(first)
    for slot, value in enumerate([0.8, 0.3, 0.5, 0.6]):
        finish(first, slot, [value])
    best = pick(sweeps.close(first), first.cfg)
    second = sweeps.open_study(swept(tmp_path, "night-2", continue_previous=True), "data-2")
    assert second.study.study_name == first.study.study_name  # one study, night to night
    sweeps.plan(second)
    opener = sweeps.ask(second, 0)
    assert opener.params == best.params
    later = sweeps.ask(second, 1)
    assert later.params != best.params
    trials = sweeps.records(second)
    assert trials[0].continued_from == "night-1-t1"
    assert {t.data_fingerprint for t in trials} == {"data-2"}  # only tonight's trials
    assert all(t.state in ("running", "waiting") for t in trials)
    earlier = [t for t in second.study.trials if t.user_attrs["sweep"] == "night-1"]
    assert len(earlier) == 4 and {t.user_attrs["data_fingerprint"] for t in earlier} == {
        "data-1"}
    # Without continue, each run has its own study: nothing carries over.
    alone = sweeps.open_study(swept(tmp_path, "night-3"), "data-3")
    assert alone.study.study_name != first.study.study_name and not alone.study.trials


def test_a_grid_gives_each_slot_its_own_point(tmp_path):
    space = {"fit.batch_size": {"choices": [32, 64]}, "fit.epochs": {"int": [2, 3]}}
    sweep = sweeps.open_study(swept(tmp_path, sampler="grid", space=space), "data-1")
    sweeps.plan(sweep)
    points = [sweeps.ask(sweep, slot).params for slot in range(4)]
    assert sorted((p["fit.batch_size"], p["fit.epochs"]) for p in points) == [
        (32, 2), (32, 3), (64, 2), (64, 3)]


def test_a_slot_not_started_within_the_budget_is_skipped_not_failed(tmp_path):
    sweep = sweeps.open_study(swept(tmp_path, timeout_minutes=30), "data-1")
    sweeps.plan(sweep)
    assert sweeps.deadline(sweep) > datetime.now(UTC)
    finish(sweep, 0, [0.5])
    past = (datetime.now(UTC) - timedelta(minutes=31)).isoformat(timespec="seconds")
    sweep.study.set_user_attr("started:night-1", past)
    skipped = sweeps.ask(sweep, 1)
    assert skipped.state == "skipped" and skipped.finished
    assert sweeps.ask(sweep, 1).state == "skipped"  # a retry too
    trials = sweeps.close(sweep)
    assert [t.state for t in trials] == ["complete", "skipped", "skipped", "skipped"]
    assert "budget of 30 minutes" in trials[1].error
    assert pick(trials, sweep.cfg).number == 0  # skipped ones are not failures


def test_sweep_json_says_what_was_tried_and_never_a_password(tmp_path):
    sweep = sweeps.open_study(swept(tmp_path, trials=2, max_failed=1), "data-1")
    sweeps.plan(sweep)
    finish(sweep, 0, [0.7, 0.6])
    finish(sweep, 1, [0.9], state="pruned")
    trials = sweeps.close(sweep)
    best = pick(trials, sweep.cfg)
    path = write_sweep_json(sweep.cfg.run_dir(), trials, best, storage=sweep.shown,
                            study=sweep.study.study_name, objective="val_loss",
                            direction="minimize", space=sweep.cfg.sweep.space)
    doc = json.loads(path.read_text())
    assert path == tmp_path / "night-1" / "sweep.json"
    assert doc["counts"] == {"trials": 2, "complete": 1, "pruned": 1, "failed": 0,
                             "skipped": 0}
    assert doc["best"]["number"] == 0 and doc["best"]["value"] == 0.6
    assert doc["trials"][0]["epochs"] == {"1": 0.7, "2": 0.6}
    assert doc["trials"][1]["state"] == "pruned"
    assert doc["trials"][0]["run_dir"] == str(tmp_path / "night-1-t0")
    # The run id beside the path (the report shows the id: the path is a worker's).
    assert [t["run_id"] for t in doc["trials"]] == ["night-1-t0", "night-1-t1"]
    assert doc["best"]["run_id"] == "night-1-t0"
    assert doc["best"]["run_dir"] == str(tmp_path / "night-1-t0")
    # The space, as the config holds it: how the report draws each field.
    assert doc["space"] == SPACE
    assert doc["trials"][0]["duration_s"] >= 0
    assert doc["study"]["storage"] == storage_url(sweep.cfg)


def test_a_storage_that_cannot_be_reached_fails_in_seconds_without_its_password(tmp_path):
    url = "postgresql+psycopg2://optuna@127.0.0.1:9/optuna"
    started = time.monotonic()
    with pytest.raises(StorageError) as err:
        open_storage(url, password="s3cret")
    assert time.monotonic() - started < 15
    message = str(err.value)
    assert message.startswith(f"the sweep's study storage {url} cannot be opened:")
    assert "s3cret" not in message
    cfg = swept(tmp_path, storage=url)
    with pytest.raises(StorageError, match="127.0.0.1:9/optuna cannot be opened"):
        sweeps.open_study(cfg, "data-1", password="s3cret")


@pytest.mark.parametrize(("sampler", "pruner"), [("tpe", "median"), ("tpe", "hyperband"),
                                                 ("random", "none")])
def test_each_sampler_and_pruner_runs_through_ask_and_tell(tmp_path, sampler, pruner):
    space = {"fit.learning_rate": {"float": [1e-4, 1e-1], "log": True},
             "fit.batch_size": {"choices": [32, 64, 128]}}
    sweep = sweeps.open_study(swept(tmp_path, trials=9, sampler=sampler, pruner=pruner,
                                    space=space, max_failed=9), "data-1")
    sweeps.plan(sweep)
    for slot in range(9):  # past TPE's random start-up (3 trials for 9)
        handle = sweeps.ask(sweep, slot)
        rate = handle.params["fit.learning_rate"]
        for epoch in range(1, 7):
            handle.report(abs(rate - 0.01) + 1 / epoch, epoch)
            if handle.should_prune():
                sweeps.tell(handle, "pruned")
                break
        else:
            sweeps.tell(handle, "complete")
    trials = sweeps.close(sweep)
    assert {t.state for t in trials} <= {"complete", "pruned"}
    assert (pruner == "none") <= all(t.state == "complete" for t in trials)
    assert pick(trials, sweep.cfg).state == "complete"


def test_a_password_for_a_sqlite_study_is_refused_naming_it(tmp_path):
    """A setting that cannot take effect: SQLite takes no password (it was a TypeError
    from sqlite3.connect, found running the tracking tests with the stack's settings)."""
    from training.errors import ConfigError

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    with pytest.raises(ConfigError, match="TRAINING_SWEEP_STORAGE_PASSWORD is set, but .* "
                                          "is a SQLite file, which takes no password"):
        open_storage(url, password="hunter2")
    assert open_storage(url) is not None  # without it, the same file opens
