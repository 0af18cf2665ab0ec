"""The Keras 3 multi-worker compatibility layer, in one process.

The patched code paths run against ``compat._probe_strategy()``: a stand-in
MultiWorkerMirroredStrategy in multi-worker mode that records every ``reduce`` (no
cluster). The real two-process proof is ``tests/integration/test_multiworker.py``.
"""

from __future__ import annotations

import logging

import pytest

from training.errors import ConfigError
from training.train import compat


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(compat.DISABLE_ENV, raising=False)
    compat.remove()
    yield
    compat.remove()


def _targets():
    import keras
    from keras.src.backend.tensorflow import trainer

    return {
        "symbolic_build": (trainer.TensorFlowTrainer, "_maybe_symbolic_build"),
        "reduce_scalar_logs": (trainer, "reduce_per_replica"),
        "backup_restore_sync": (keras.callbacks.BackupAndRestore, "on_train_begin"),
    }


def test_installed_keras_still_needs_every_patch():
    """Fails, naming the patch, on the day a Keras upgrade fixes an upstream bug."""
    import keras

    still = compat.needed()
    fixed = sorted(set(compat.ISSUES) - set(still))
    assert not fixed, (
        f"keras {keras.__version__} no longer needs the multi-worker patch(es) {fixed} "
        f"({', '.join(compat.ISSUES[n] for n in fixed)}): remove them from "
        f"training/train/compat.py and docs/multiworker.md, then run "
        f"tests/integration/test_multiworker.py"
    )
    for name, evidence in still.items():
        assert compat.ISSUES[name] in evidence


def test_apply_is_a_no_op_for_other_strategies():
    import tensorflow as tf

    originals = {n: getattr(o, a) for n, (o, a) in _targets().items()}
    assert compat.apply(tf.distribute.OneDeviceStrategy("/cpu:0")) == []
    assert compat.apply(None) == []
    assert compat.active() == []
    assert all(getattr(o, a) is originals[n] for n, (o, a) in _targets().items())


def test_apply_is_idempotent_and_remove_restores_the_originals():
    originals = {n: getattr(o, a) for n, (o, a) in _targets().items()}
    strategy = compat._probe_strategy()

    assert sorted(compat.apply(strategy)) == sorted(compat.ISSUES)
    assert compat.active() == sorted(compat.ISSUES)
    assert all(getattr(o, a) is not originals[n] for n, (o, a) in _targets().items())
    assert compat.apply(strategy) == []  # already installed
    assert compat.enable() == []

    compat.remove()
    assert compat.active() == []
    assert all(getattr(o, a) is originals[n] for n, (o, a) in _targets().items())


def test_applied_context_manager_undoes_only_what_it_installed():
    originals = {n: getattr(o, a) for n, (o, a) in _targets().items()}
    with compat.applied(compat._probe_strategy()) as installed:
        assert sorted(installed) == sorted(compat.ISSUES)
        with compat.applied(compat._probe_strategy()) as nested:
            assert nested == []
        assert compat.active() == sorted(compat.ISSUES)  # the inner block removed nothing
    assert compat.active() == []
    assert all(getattr(o, a) is originals[n] for n, (o, a) in _targets().items())


def test_the_environment_switch_disables_the_layer(monkeypatch, caplog):
    monkeypatch.setenv(compat.DISABLE_ENV, "off")
    with caplog.at_level(logging.WARNING, logger="training.train.compat"):
        assert compat.apply(compat._probe_strategy()) == []
    assert compat.active() == []
    assert "disabled by TRAINING_KERAS_COMPAT=off" in caplog.text


def test_the_environment_switch_leaves_out_named_patches(monkeypatch):
    monkeypatch.setenv(compat.DISABLE_ENV, "without:reduce_scalar_logs")
    assert sorted(compat.enable()) == ["backup_restore_sync", "symbolic_build"]
    monkeypatch.setenv(compat.DISABLE_ENV, "without:no_such_patch")
    compat.remove()
    with pytest.raises(ConfigError, match=r"unknown patches \['no_such_patch'\]"):
        compat.enable()


def test_patched_reduce_reduces_scalar_logs_over_replicas_with_axis_none():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    strategy = compat._probe_strategy()
    with compat.applied(strategy):
        logs = trainer.reduce_per_replica(
            {"loss": tf.constant(2.0), "preds": tf.zeros((4, 3))}, strategy, "auto")
    assert float(logs["loss"]) == 2.0
    reduces = {tuple(v.shape): (op, axis) for op, v, axis in strategy.reduces}
    assert reduces[()] == ("MEAN", None)  # the upstream code asks for axis=0 here
    assert reduces[(4, 3)] == ("MEAN", 0)  # batched values stay with Keras's own code


def test_patched_reduce_hands_other_strategies_to_keras():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    with compat.applied(compat._probe_strategy()):
        out = trainer.reduce_per_replica({"loss": tf.constant(3.0)},
                                         tf.distribute.get_strategy(), "auto")
    assert float(out["loss"]) == 3.0


def test_patched_symbolic_build_builds_from_the_local_batch_without_a_reduce():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer
    from tensorflow.python.distribute import values as values_lib

    strategy = compat._probe_strategy()
    local = tf.ones((2, 3))

    class Trainer:
        _distribute_strategy = strategy
        distribute_strategy = strategy

        def _symbolic_build(self, data_batch=None):
            self.built_from = data_batch

    def epoch_iterator():
        yield 0, 0, iter([(values_lib.PerReplica((local,)), local)])

    t = Trainer()
    with compat.applied(strategy):
        trainer.TensorFlowTrainer._maybe_symbolic_build(t, iterator=epoch_iterator())
    assert strategy.reduces == []
    assert t.built_from[0] is local and t.built_from[1] is local


def test_installed_keras_still_needs_the_steps_per_execution_loop():
    """Fails on the day Keras's loop no longer leaves the collectives' instance keys
    unfed inside its tf.cond (``compat_steps.py``)."""
    import keras

    from training.train import compat_steps

    evidence = compat_steps.needed()
    assert evidence is not None, (
        f"keras {keras.__version__} no longer needs {compat_steps.NAME}: remove "
        "training/train/compat_steps.py and its call in compat.apply, then run "
        "tests/integration/test_fit.py")
    assert "unfed" in evidence and compat_steps.ISSUE in evidence


def test_the_steps_per_execution_loop_is_installed_for_more_than_one_replica_but_tpu():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    from training.train import compat_steps

    original = trainer.TensorFlowTrainer._make_function
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with compat.applied(mirrored) as installed:
        assert installed == [compat_steps.NAME]
        assert trainer.TensorFlowTrainer._make_function is compat_steps._make_function
    assert trainer.TensorFlowTrainer._make_function is original
    assert compat.apply(tf.distribute.MirroredStrategy(["/cpu:0"])) == []  # one replica
