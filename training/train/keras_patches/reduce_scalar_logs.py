"""``reduce_scalar_logs``: Keras reduces the per-replica logs along an axis scalars lack.

In multi-worker mode ``reduce_per_replica`` (keras/src/backend/tensorflow/trainer.py,
keras 3.15.1) reduces every log with ``strategy.reduce("MEAN", v, axis=0)``. The logs
(loss, metrics) are scalars, so this raises ``ValueError: Invalid reduction dimension 0
for input with 0 dimensions``. Upstream: keras-team/keras#20585 (open) and
tensorflow/tensorflow#72388.

The replacement reduces scalars over the replicas (``axis=None``, the mean); anything
with a batch dimension, and any other strategy, still goes to Keras's own code.
"""

from __future__ import annotations

from typing import Any

from training.train.keras_patches.patch import (
    MULTI_WORKER,
    Patch,
    is_multi_worker,
    original,
    trainer_module,
)
from training.train.keras_patches.probe_strategy import probe_strategy

NAME = "reduce_scalar_logs"
ISSUE = "keras-team/keras#20585, tensorflow/tensorflow#72388"


def _target() -> tuple[Any, str]:
    return trainer_module(), "reduce_per_replica"


def _rank(strategy: Any, value: Any) -> int | None:
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        value = strategy.experimental_local_results(value)[0]
    shape = getattr(value, "shape", None)
    return None if shape is None else shape.rank


def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
    """Keras's ``reduce_per_replica``, scalars reduced with ``axis=None``."""
    import tensorflow as tf
    from keras.src import tree

    keras_own = original(*_target())
    if reduction == "auto" and not isinstance(strategy, tf.distribute.TPUStrategy):
        reduction = "mean"
    if reduction != "mean" or not is_multi_worker(strategy):
        return keras_own(values, strategy, reduction)

    def reduce_one(value: Any) -> Any:
        if _rank(strategy, value) == 0:
            return strategy.reduce("MEAN", value, axis=None)
        return keras_own(value, strategy, reduction)

    return tree.map_structure(reduce_one, values)


def probe() -> str | None:
    """Keras's own function on a scalar log: does it reduce along an axis?"""
    import tensorflow as tf

    recorder = probe_strategy()
    original(*_target())({"loss": tf.constant(1.0)}, recorder, "auto")
    for op, value, axis in recorder.reduces:
        if axis is not None and getattr(value, "shape", None) is not None \
                and value.shape.rank == 0:
            return (f"reduce_per_replica reduces scalar logs with strategy.reduce({op}, "
                    f"axis={axis}) under MultiWorkerMirroredStrategy")
    return None


PATCH = Patch(NAME, ISSUE, MULTI_WORKER, _target, reduce_per_replica, probe)
