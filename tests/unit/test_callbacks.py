"""The project's Keras callbacks (``training.train.callbacks``) on tiny models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.errors import ConfigError


def _watched(tmp_path):
    import keras

    return {"early_stopping": keras.callbacks.EarlyStopping(),
            "reduce_lr": keras.callbacks.ReduceLROnPlateau(),
            "checkpoint": keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"))}


def test_weights_digest_depends_on_every_weight():
    from training.train.callbacks.weights_report import weights_digest

    class Model:
        def __init__(self, weights):
            self.weights = weights

        def get_weights(self):
            return self.weights

    a = [np.zeros((2, 3), np.float32), np.ones(3, np.float32)]
    b = [np.zeros((2, 3), np.float32), np.array([1, 1, 2], np.float32)]
    c = [np.zeros((3, 2), np.float32), np.ones(3, np.float32)]
    digests = {weights_digest(Model(w)) for w in (a, b, c)}
    assert len(digests) == 3
    assert weights_digest(Model(a)) == weights_digest(Model([x.copy() for x in a]))


def test_weights_report_records_every_epoch_and_the_final_digest(tmp_path):
    import keras

    from training.train.callbacks.weights_report import WeightsReport, weights_digest

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    report = WeightsReport(tmp_path / "out" / "worker-1.json", index=1)
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    model.fit(x, x[:, :2], epochs=2, verbose=0, callbacks=[report])
    written = json.loads((tmp_path / "out" / "worker-1.json").read_text())
    assert written["index"] == 1
    assert written["digest"] == report.digest == weights_digest(model)
    assert [e["epoch"] for e in written["epochs"]] == [1, 2]
    assert all("loss" in e for e in written["epochs"])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"index": -1}, "index must be a worker index >= 0, got -1"),
    ({"index": True}, "index must be a worker index >= 0, got True"),
    ({"path": ""}, "path must be a file path or None, got ''"),
])
def test_weights_report_says_what_it_got(kwargs, message):
    from training.train.callbacks.weights_report import WeightsReport

    with pytest.raises(ConfigError, match=message):
        WeightsReport(**kwargs)


@pytest.mark.parametrize(("change", "message"), [
    ({"min_interval_s": -1}, "min_interval_s must be a number of seconds >= 0, got -1"),
    ({"min_interval_s": "30"}, "min_interval_s must be a number of seconds >= 0, got '30'"),
    ({"backup_dir": ""}, "backup_dir must be a directory path, got ''"),
    ({"early_stopping": None}, "early_stopping must be a keras.callbacks.EarlyStopping, "
                               "got None"),
    ({"reduce_lr": "plateau"}, "reduce_lr must be a keras.callbacks.ReduceLROnPlateau, "
                               "got 'plateau'"),
])
def test_resumable_backup_says_what_it_got(tmp_path, change, message):
    from training.train.callbacks.backup import ResumableBackup

    kwargs = {"backup_dir": tmp_path / "backup", **_watched(tmp_path), **change}
    with pytest.raises(ConfigError, match=message):
        ResumableBackup(**kwargs)


def test_resumable_backup_describes_the_watched_callbacks(tmp_path):
    from training.train.callbacks.backup import ResumableBackup

    backup = ResumableBackup(tmp_path / "backup", **_watched(tmp_path), min_interval_s=30)
    described = backup.describe()  # no model yet: no learning rate
    assert described["learning_rate"] is None
    assert described["early_stopping"]["monitor"] == "val_loss"
    assert described["early_stopping"]["best_weights"] is None
    assert set(described) == {"early_stopping", "reduce_lr_on_plateau", "model_checkpoint",
                              "learning_rate"}


@pytest.mark.parametrize("signalled_in", [2, 3])  # of 3 epochs: one follows, none follows
def test_a_stop_signal_in_validation_lets_every_callback_see_the_epoch_end(tmp_path,
                                                                          signalled_in):
    """SIGTERM (``stop_signal``, as ``preemption.stop_on_sigterm`` sets it) during an
    epoch's validation: its backup says the epoch completed, so the callbacks after the
    backup (a sweep's pruning report, the epoch's tracking) must see that epoch end
    before training stops, or the resumed run, which starts after it, never gives it
    them (a trial's objective lost epoch 5 in CI)."""
    import signal

    import keras

    from training.errors import Preempted
    from training.train import resume
    from training.train.callbacks.backup import ResumableBackup

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    backup = ResumableBackup(tmp_path / "backup", **_watched(tmp_path))

    class SignalInValidation(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_test_begin(self, logs=None):
            if self.epoch + 1 == signalled_in:
                backup.stop_signal = signal.SIGTERM

    class After(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.began: list[int] = []
            self.ended: list[int] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.began.append(epoch + 1)

        def on_epoch_end(self, epoch, logs=None):
            self.ended.append(epoch + 1)

    after = After()
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    with pytest.raises(Preempted) as stopped:
        model.fit(x, x[:, :2], validation_data=(x, x[:, :2]), epochs=3, batch_size=8,
                  verbose=0, callbacks=[SignalInValidation(), backup, after])
    assert (stopped.value.epoch, stopped.value.batch) == (signalled_in + 1, 0)
    assert after.ended == list(range(1, signalled_in + 1))  # the stopped epoch's end too
    assert after.began == list(range(1, signalled_in + 1))  # and no epoch after it
    state = resume.read(tmp_path / "backup")
    assert state is not None and state["epochs_completed"] == signalled_in, state
    assert state["mid_epoch"] is None
