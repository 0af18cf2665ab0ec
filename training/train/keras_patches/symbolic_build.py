"""``symbolic_build``: Keras builds the model from a reduce that fails under the collective
strategy.

``TensorFlowTrainer._maybe_symbolic_build`` (keras/src/backend/tensorflow/trainer.py,
keras 3.15.1) reduces the first *distributed* batch with ``strategy.reduce("MEAN",
batch, axis=None)`` to get a plain batch to build from. Under MultiWorkerMirroredStrategy
that eager reduce raises ``ValueError: Attempt to convert a value (PerReplica:{...})
with an unsupported type``. Upstream: keras-team/keras#20585 (open) and
tensorflow/tensorflow#72388.

The replacement builds from this worker's first local replica batch: symbolic building
only needs shapes and dtypes, which every replica shares. Any other strategy goes to
Keras's own code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from training.train.keras_patches.patch import (
    MULTI_WORKER,
    Patch,
    is_multi_worker,
    original,
    trainer_module,
)
from training.train.keras_patches.probe_strategy import probe_strategy

NAME = "symbolic_build"
ISSUE = "keras-team/keras#20585, tensorflow/tensorflow#72388"


def _target() -> tuple[Any, str]:
    return trainer_module().TensorFlowTrainer, "_maybe_symbolic_build"


def _local_batch(strategy: Any, batch: Any) -> Any:
    """This worker's first replica's part of a distributed batch: a plain batch."""
    import tensorflow as tf
    from keras.src import tree

    def local(x: Any) -> Any:
        if isinstance(x, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(x)[0]
        return x

    return tree.map_structure(local, batch)


def maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
    """``TensorFlowTrainer._maybe_symbolic_build``, building from the local batch."""
    keras_own = original(*_target())
    strategy = self._distribute_strategy
    if strategy is None or iterator is None or not is_multi_worker(strategy):
        return keras_own(self, iterator=iterator, data_batch=data_batch)
    for _, _, it in iterator:
        data_batch = _local_batch(strategy, next(it))
        break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)
    return None


def probe() -> str | None:
    """Keras's own method against the recording strategy: does it reduce the batch?"""
    import tensorflow as tf
    from tensorflow.python.distribute import values as values_lib

    recorder = probe_strategy()
    batch = values_lib.PerReplica((tf.zeros((2, 3)),))

    class _Trainer:
        _distribute_strategy = recorder
        distribute_strategy = recorder

        def _symbolic_build(self, data_batch: Any = None) -> None:
            self.built_from = data_batch

    def iterator() -> Iterator[tuple[int, int, Iterator[Any]]]:
        yield 0, 0, iter([batch])

    original(*_target())(_Trainer(), iterator=iterator())
    for op, value, _ in recorder.reduces:
        if isinstance(value, tf.distribute.DistributedValues):
            return (f"TensorFlowTrainer._maybe_symbolic_build reduces the first distributed "
                    f"batch with strategy.reduce({op}) under MultiWorkerMirroredStrategy")
    return None


PATCH = Patch(NAME, ISSUE, MULTI_WORKER, _target, maybe_symbolic_build, probe)
