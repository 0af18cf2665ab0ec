"""The Keras patches (``training.train.keras_patches``), in one process.

The patched code paths run against ``probe_strategy()``: a stand-in
MultiWorkerMirroredStrategy in multi-worker mode that records every ``reduce`` (no
cluster). The real two-process proof is ``tests/integration/test_multiworker.py``.
"""

from __future__ import annotations

import logging

import pytest

from training.errors import ConfigError
from training.train import keras_patches as patches
from training.train.keras_patches import steps_in_cond
from training.train.keras_patches.patch import MULTI_WORKER
from training.train.keras_patches.probe_strategy import probe_strategy

MULTI_WORKER_PATCHES = sorted(n for n, p in patches.PATCHES.items() if p.scope == MULTI_WORKER)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(patches.DISABLE_ENV, raising=False)
    patches.remove()
    yield
    patches.remove()


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

    still = patches.needed()
    fixed = sorted(set(MULTI_WORKER_PATCHES) - set(still))
    assert not fixed, (
        f"keras {keras.__version__} no longer needs the multi-worker patch(es) {fixed} "
        f"({', '.join(patches.PATCHES[n].issue for n in fixed)}): remove their modules "
        f"from training/train/keras_patches/ and docs/multiworker.md, then run "
        f"tests/integration/test_multiworker.py"
    )
    assert sorted(still) == MULTI_WORKER_PATCHES
    for name, evidence in still.items():
        assert patches.PATCHES[name].issue in evidence


def test_apply_is_a_no_op_for_other_strategies():
    import tensorflow as tf

    originals = {n: getattr(o, a) for n, (o, a) in _targets().items()}
    assert patches.install_for(tf.distribute.OneDeviceStrategy("/cpu:0")) == []
    assert patches.install_for(None) == []
    assert patches.installed() == []
    assert all(getattr(o, a) is originals[n] for n, (o, a) in _targets().items())


def test_apply_is_idempotent_and_remove_restores_the_originals():
    originals = {n: getattr(o, a) for n, (o, a) in _targets().items()}
    strategy = probe_strategy()

    assert sorted(patches.install_for(strategy)) == MULTI_WORKER_PATCHES
    assert patches.installed() == MULTI_WORKER_PATCHES
    assert all(getattr(o, a) is not originals[n] for n, (o, a) in _targets().items())
    assert patches.install_for(strategy) == []  # already installed
    assert patches.enable() == []

    patches.remove()
    assert patches.installed() == []
    assert all(getattr(o, a) is originals[n] for n, (o, a) in _targets().items())


def test_applied_context_manager_undoes_only_what_it_installed():
    originals = {n: getattr(o, a) for n, (o, a) in _targets().items()}
    with patches.applied(probe_strategy()) as installed:
        assert sorted(installed) == MULTI_WORKER_PATCHES
        with patches.applied(probe_strategy()) as nested:
            assert nested == []
        assert patches.installed() == MULTI_WORKER_PATCHES  # the inner block removed nothing
    assert patches.installed() == []
    assert all(getattr(o, a) is originals[n] for n, (o, a) in _targets().items())


def test_the_environment_switch_disables_the_layer(monkeypatch, caplog):
    monkeypatch.setenv(patches.DISABLE_ENV, "off")
    with caplog.at_level(logging.WARNING, logger="training.train.keras_patches"):
        assert patches.install_for(probe_strategy()) == []
    assert patches.installed() == []
    assert "Keras patches disabled by TRAINING_KERAS_COMPAT=off" in caplog.text


def test_the_environment_switch_leaves_out_named_patches(monkeypatch):
    monkeypatch.setenv(patches.DISABLE_ENV, "without:reduce_scalar_logs")
    assert sorted(patches.enable()) == ["backup_restore_sync", "symbolic_build"]
    monkeypatch.setenv(patches.DISABLE_ENV, "without:no_such_patch")
    patches.remove()
    with pytest.raises(ConfigError, match=r"unknown patches \['no_such_patch'\]"):
        patches.enable()


def test_patched_reduce_reduces_scalar_logs_over_replicas_with_axis_none():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    strategy = probe_strategy()
    with patches.applied(strategy):
        logs = trainer.reduce_per_replica(
            {"loss": tf.constant(2.0), "preds": tf.zeros((4, 3))}, strategy, "auto")
    assert float(logs["loss"]) == 2.0
    reduces = {tuple(v.shape): (op, axis) for op, v, axis in strategy.reduces}
    assert reduces[()] == ("MEAN", None)  # the upstream code asks for axis=0 here
    assert reduces[(4, 3)] == ("MEAN", 0)  # batched values stay with Keras's own code


def test_patched_reduce_hands_other_strategies_to_keras():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    with patches.applied(probe_strategy()):
        out = trainer.reduce_per_replica({"loss": tf.constant(3.0)},
                                         tf.distribute.get_strategy(), "auto")
    assert float(out["loss"]) == 3.0


def test_patched_symbolic_build_builds_from_the_local_batch_without_a_reduce():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer
    from tensorflow.python.distribute import values as values_lib

    strategy = probe_strategy()
    local = tf.ones((2, 3))

    class Trainer:
        _distribute_strategy = strategy
        distribute_strategy = strategy

        def _symbolic_build(self, data_batch=None):
            self.built_from = data_batch

    def epoch_iterator():
        yield 0, 0, iter([(values_lib.PerReplica((local,)), local)])

    t = Trainer()
    with patches.applied(strategy):
        trainer.TensorFlowTrainer._maybe_symbolic_build(t, iterator=epoch_iterator())
    assert strategy.reduces == []
    assert t.built_from[0] is local and t.built_from[1] is local


def test_installed_keras_still_needs_the_steps_per_execution_loop():
    """Fails on the day Keras's loop no longer leaves the collectives' instance keys
    unfed inside its tf.cond (``keras_patches/steps_in_cond.py``)."""
    import keras

    evidence = patches.needed(steps_in_cond.PATCH.scope).get(steps_in_cond.NAME)
    assert evidence is not None, (
        f"keras {keras.__version__} no longer needs {steps_in_cond.NAME}: remove "
        "training/train/keras_patches/steps_in_cond.py, then run tests/integration/test_fit.py")
    assert "unfed" in evidence and steps_in_cond.ISSUE in evidence


def test_the_steps_per_execution_loop_is_installed_for_more_than_one_replica_but_tpu():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    original = trainer.TensorFlowTrainer._make_function
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with patches.applied(mirrored) as installed:
        assert installed == [steps_in_cond.NAME]
        assert trainer.TensorFlowTrainer._make_function is steps_in_cond.make_function
    assert trainer.TensorFlowTrainer._make_function is original
    assert patches.install_for(tf.distribute.MirroredStrategy(["/cpu:0"])) == []  # one replica
