"""``backup_restore_sync``: Keras 3's BackupAndRestore restores each worker on its own.

Keras 3's ``BackupAndRestore.on_train_begin`` is not multi-worker aware: each worker
restores from its own ``backup_dir``. The chief's is the run's ``backup/``, the other
workers' are fresh temporary directories (chief-only writes), so after an interruption
the chief resumes at epoch k with its backed-up weights while the others start at epoch
0 from fresh weights: the workers run different numbers of steps and the collectives
hang, or the weights silently diverge. Keras 3 has no multi-worker handling here since
3.0 (found in this project, not reported upstream).

The replacement runs Keras's own restore, then broadcasts the chief's variables (model
and optimizer) and initial epoch to every worker with one all-reduce
(``broadcast_from_replica_0``, also used by ``training.train.resume`` for the callbacks'
state).
"""

from __future__ import annotations

import logging
from typing import Any

from training.train.keras_patches.patch import MULTI_WORKER, Patch, is_multi_worker, original

log = logging.getLogger(__name__)

NAME = "backup_restore_sync"
ISSUE = "Keras 3 BackupAndRestore restores per worker (no multi-worker handling since Keras 3.0)"


def _target() -> tuple[Any, str]:
    import keras

    return keras.callbacks.BackupAndRestore, "on_train_begin"


def broadcast_from_replica_0(strategy: Any, tensors: list[Any]) -> list[Any]:
    """Every worker gets replica 0's (the chief's first device) values: one all-reduce.

    Every worker must call it at the same point with values of the same shapes and
    dtypes (a collective)."""
    import tensorflow as tf

    def replica_fn(*values: Any) -> list[Any]:
        ctx = tf.distribute.get_replica_context()
        first = tf.equal(ctx.replica_id_in_sync_group, 0)
        masked = [tf.where(first, v, tf.zeros_like(v)) for v in values]
        masked = [tf.cast(v, tf.int32) if v.dtype == tf.bool else v for v in masked]
        by_dtype: dict[Any, list[int]] = {}
        for i, v in enumerate(masked):
            by_dtype.setdefault(v.dtype, []).append(i)
        reduced: list[Any] = [None] * len(values)
        for indices in by_dtype.values():  # all_reduce packs a list: one dtype per call
            for i, r in zip(indices, ctx.all_reduce("SUM", [masked[i] for i in indices]),
                            strict=True):
                reduced[i] = tf.cast(r, values[i].dtype)
        return reduced

    @tf.function
    def broadcast(*values: Any) -> Any:
        return strategy.run(replica_fn, args=values)

    result = broadcast(*tensors)
    return [strategy.experimental_local_results(r)[0] for r in result]


def on_train_begin(self: Any, logs: Any = None) -> Any:
    """``BackupAndRestore.on_train_begin``, then the chief's restored state everywhere."""
    import keras
    import numpy as np

    result = original(*_target())(self, logs)
    strategy = getattr(self.model, "_distribute_strategy", None)
    if strategy is None or not is_multi_worker(strategy):
        return result
    model = self.model
    optimizer = model.optimizer
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    variables = list(model.variables)
    if optimizer is not None:
        variables += [v for v in optimizer.variables if all(v is not w for w in variables)]
    epoch = np.asarray(getattr(model, "_initial_epoch", None) or 0, dtype=np.int64)
    values = [keras.ops.convert_to_numpy(v.value) for v in variables] + [epoch]
    synced = broadcast_from_replica_0(strategy, values)
    for variable, value in zip(variables, synced[:-1], strict=True):
        variable.assign(value)
    chief_epoch = int(synced[-1])
    if chief_epoch != int(epoch):
        log.info("BackupAndRestore: resuming at the chief's epoch %d (this worker had %d)",
                 chief_epoch, int(epoch))
    model._initial_epoch = chief_epoch or None
    return result


def probe() -> str | None:
    """Does Keras's BackupAndRestore say anything about workers or distribution?"""
    import inspect

    import keras

    source = inspect.getsource(keras.callbacks.BackupAndRestore)
    if any(word in source for word in ("distribute", "is_chief", "worker")):
        return None
    return "BackupAndRestore restores from each worker's own backup_dir, nothing synced"


PATCH = Patch(NAME, ISSUE, MULTI_WORKER, _target, on_train_begin, probe)
