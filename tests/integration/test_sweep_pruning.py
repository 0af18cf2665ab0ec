"""The pruning callback on a real study: a tiny Keras model fitted on tiny arrays, one
trial that learns and one that does not; the second is pruned as soon as the median
pruner judges (after its warm-up: the first epoch, a fifth of 6 but at least one, is never
judged), stops there, and is recorded pruned."""

from __future__ import annotations

import json
import time

import keras
import numpy as np
import pytest

from training.config.run import RunConfig
from training.sweep import study as sweeps
from training.sweep.pick import pick
from training.sweep.pruning import PruningCallback
from training.sweep.record import write_sweep_json
from training.sweep.trial import trial_config

pytestmark = pytest.mark.slow

EPOCHS = 6
GOOD, BAD = 0.05, 1e-7  # learning rates: one learns in an epoch, one does not move


def swept(output_dir, **sweep) -> RunConfig:
    sections = {"storage": {"output_dir": str(output_dir), "run_id": "night-1"},
                "fit": {"epochs": EPOCHS, "early_stopping_monitor": "val_loss"}}
    sweep = {"trials": 2, "sampler": "grid", "pruner": "median",
             "space": {"fit.learning_rate": {"choices": [GOOD, BAD]}}, **sweep}
    return RunConfig.from_dict({**sections, "sweep": sweep})


def data() -> tuple[np.ndarray, np.ndarray]:
    """Two separable classes: the label's one-hot, scaled, plus noise."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 256)
    x = np.eye(2)[labels].repeat(4, axis=1) * 3 + rng.normal(0, 0.5, (256, 8))
    return x.astype("float32"), labels


def fit(cfg: RunConfig, callback: PruningCallback) -> keras.callbacks.History:
    keras.utils.set_random_seed(0)  # the same weights for every trial
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.Adam(cfg.fit.learning_rate),
                  "sparse_categorical_crossentropy")
    x, y = data()
    return model.fit(x, y, validation_split=0.25, batch_size=cfg.fit.batch_size,
                     epochs=cfg.fit.epochs, callbacks=[callback], verbose=0)


def test_a_trial_that_falls_behind_is_pruned_stops_and_is_recorded(tmp_path):
    cfg = swept(tmp_path)
    sweep = sweeps.open_study(cfg, "data-1")
    sweeps.plan(sweep)
    handles = {sweeps.ask(sweep, slot).params["fit.learning_rate"]: slot for slot in (0, 1)}
    assert set(handles) == {GOOD, BAD}  # the grid gives each slot its own point
    results = {}
    for rate in (GOOD, BAD):  # the good one completes first: the median to beat
        slot = handles[rate]
        handle = sweeps.ask(sweep, slot)  # as the trial's task would, after its claim
        trial = trial_config(cfg, slot, handle.params)
        assert trial.fit.learning_rate == rate
        pruning = PruningCallback(handle, monitor=trial.fit.early_stopping_monitor)
        history = fit(trial, pruning)
        results[rate] = (pruning, history, sweeps.tell(handle, "complete"))
    good, bad = results[GOOD], results[BAD]
    assert not good[0].pruned and len(good[1].epoch) == EPOCHS and good[2] == "complete"
    assert bad[0].pruned and bad[0].pruned_at == 2  # its first epoch is never judged
    assert len(bad[1].epoch) == 2  # stopped at once, not after its 6 epochs
    assert bad[2] == "pruned"  # the callback told it; the later "complete" is ignored
    trials = sweeps.close(sweep)
    by_slot = {t.number: t for t in trials}
    assert by_slot[handles[BAD]].state == "pruned"
    assert list(by_slot[handles[BAD]].epochs) == [1, 2]
    assert list(by_slot[handles[GOOD]].epochs) == list(range(1, EPOCHS + 1))
    best = pick(trials, cfg)
    assert best.number == handles[GOOD]
    assert best.value == min(good[1].history["val_loss"])  # the best epoch's
    path = write_sweep_json(cfg.run_dir(), trials, best, storage=sweep.shown,
                            study=sweep.study.study_name, objective="val_loss",
                            direction="minimize")
    assert json.loads(path.read_text())["counts"] == {
        "trials": 2, "complete": 1, "pruned": 1, "failed": 0, "skipped": 0}


def test_a_trial_stops_after_its_epoch_once_the_budget_is_spent(tmp_path):
    cfg = swept(tmp_path, pruner="none", timeout_minutes=60)
    sweep = sweeps.open_study(cfg, "data-1")
    handle = sweeps.ask(sweep, 0)
    pruning = PruningCallback(handle, "val_loss", deadline=time.time() - 1)
    history = fit(trial_config(cfg, 0, handle.params), pruning)
    assert len(history.epoch) == 1 and pruning.out_of_time and not pruning.pruned
    assert sweeps.tell(handle, "complete") == "complete"


def test_the_callback_checks_what_it_is_given():
    with pytest.raises(TypeError, match="trial must have report, should_prune and prune"):
        PruningCallback(object(), "val_loss")

    class Handle:
        def report(self, value, step): ...
        def should_prune(self): return False
        def prune(self): ...

    with pytest.raises(ValueError, match="monitor must name a metric of the logs"):
        PruningCallback(Handle(), "")
    with pytest.raises(ValueError, match="deadline must be a time.time"):
        PruningCallback(Handle(), "val_loss", deadline=float("nan"))
