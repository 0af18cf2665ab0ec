"""Keras 3 + ``tf.distribute.MultiWorkerMirroredStrategy``: the patches ``model.fit`` needs.

With tensorflow 2.21 and keras 3.15 ``model.fit`` under MultiWorkerMirroredStrategy
(more than one worker) fails twice inside Keras's TensorFlow trainer
(``keras/src/backend/tensorflow/trainer.py``); upstream reports: keras-team/keras#20585
("Does Keras 3 work with tf.distribute.MultiWorkerMirroredStrategy?", open) and
tensorflow/tensorflow#72388 (the same failure from the TensorFlow side). A third gap,
found here, makes a resumed run hang or silently diverge. Each patch below says what
breaks, why, and what it does instead:

``symbolic_build``
    ``TensorFlowTrainer._maybe_symbolic_build`` reduces the first *distributed* batch
    with ``strategy.reduce("MEAN", batch, axis=None)`` to get a plain batch to build
    from. Under the collective strategy that eager reduce raises ``ValueError: Attempt
    to convert a value (PerReplica:{...}) with an unsupported type``. The patch builds
    from this worker's first local replica batch instead: symbolic building only needs
    shapes and dtypes, which every replica shares.
``reduce_scalar_logs``
    ``reduce_per_replica`` reduces the per-replica logs (loss, metrics: scalars) with
    ``strategy.reduce("MEAN", v, axis=0)`` in multi-worker mode, which raises
    ``ValueError: Invalid reduction dimension 0 for input with 0 dimensions``. The patch
    reduces scalars with ``axis=None`` (the mean over replicas); anything with a batch
    dimension still goes to Keras's own code.
``backup_restore_sync``
    Keras 3's ``BackupAndRestore`` is not multi-worker aware: each worker restores from
    its own ``backup_dir``. The chief's is the run's ``backup/``, the other workers'
    are fresh temporary directories (chief-only writes), so after an interruption the
    chief resumes at epoch k with its backed-up weights while the others start at
    epoch 0 from fresh weights: the workers run different numbers of steps and the
    collectives hang. The patch, after the restore, broadcasts the chief's variables
    (model and optimizer) and initial epoch to every worker with one all-reduce.

Everything is applied only under MultiWorkerMirroredStrategy (``apply(strategy)``
installs nothing else of this module for any other strategy; it also installs
``compat_steps.py``, the ``steps_per_execution`` loop, under every strategy with more
than one replica but TPU), and each patched function still hands over to the
original unless the strategy it meets is in multi-worker mode. ``apply`` is idempotent;
``remove()`` and the ``applied()`` context manager undo it (for tests).

``needed()`` probes the installed Keras's own code paths with a recording stand-in
strategy (no cluster needed) and returns the patches it still needs. ``apply`` only
installs those and logs a WARNING for every patch the installed Keras no longer needs;
``tests/unit/test_compat.py`` fails, naming the patch, when that happens, so whoever
upgrades Keras sees it. ``TRAINING_KERAS_COMPAT=off`` in the environment disables the
whole layer and ``TRAINING_KERAS_COMPAT=without:NAME,...`` leaves out single patches (to
reproduce the upstream failures; ``tests/integration/test_multiworker.py`` does).

Why one module of about 450 lines: the three patches, the probes that tell when Keras no
longer needs each, and the switch that installs them belong together: a Keras upgrade
is checked, and the layer retired, in this one file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from training.train import compat_steps  # light: Keras and TensorFlow load inside

log = logging.getLogger(__name__)

DISABLE_ENV = "TRAINING_KERAS_COMPAT"

ISSUES = {
    "symbolic_build": "keras-team/keras#20585, tensorflow/tensorflow#72388",
    "reduce_scalar_logs": "keras-team/keras#20585, tensorflow/tensorflow#72388",
    "backup_restore_sync": "Keras 3 BackupAndRestore restores per worker "
                           "(no multi-worker handling since Keras 3.0)",
}


@dataclass(frozen=True)
class _Patch:
    name: str
    owner: Any  # module or class holding the attribute
    attribute: str
    replacement: Callable[..., Any]


_originals: dict[str, tuple[Any, str, Any]] = {}  # patch name -> (owner, attribute, original)


def _trainer_module() -> Any:
    from keras.src.backend.tensorflow import trainer

    return trainer


def _original(owner: Any, attribute: str) -> Any:
    """The unpatched attribute, whether or not the patch is installed now."""
    for own, attr, original in _originals.values():
        if own is owner and attr == attribute:
            return original
    return getattr(owner, attribute)


def is_multi_worker(strategy: Any) -> bool:
    """True for a MultiWorkerMirroredStrategy that spans more than one worker."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    return bool(strategy.extended._in_multi_worker_mode())


# --- patch: symbolic_build ---------------------------------------------------------------

def _local_batch(strategy: Any, batch: Any) -> Any:
    """This worker's first replica's part of a distributed batch: a plain batch."""
    import tensorflow as tf
    from keras.src import tree

    def local(x: Any) -> Any:
        if isinstance(x, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(x)[0]
        return x

    return tree.map_structure(local, batch)


def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
    # keras-team/keras#20585, tensorflow/tensorflow#72388: Keras reduces the first
    # distributed batch with strategy.reduce(..., axis=None), which fails eagerly under
    # the collective strategy. Build from the local replica's batch instead; the rest
    # mirrors TensorFlowTrainer._maybe_symbolic_build (keras 3.15.1).
    trainer = _trainer_module()
    original = _original(trainer.TensorFlowTrainer, "_maybe_symbolic_build")
    strategy = self._distribute_strategy
    if strategy is None or iterator is None or not is_multi_worker(strategy):
        return original(self, iterator=iterator, data_batch=data_batch)
    for _, _, it in iterator:
        data_batch = _local_batch(strategy, next(it))
        break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)
    return None


# --- patch: reduce_scalar_logs -----------------------------------------------------------

def _rank(strategy: Any, value: Any) -> int | None:
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        value = strategy.experimental_local_results(value)[0]
    shape = getattr(value, "shape", None)
    return None if shape is None else shape.rank


def _reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
    # keras-team/keras#20585, tensorflow/tensorflow#72388: in multi-worker mode Keras
    # reduces every log with strategy.reduce("MEAN", v, axis=0); the logs are scalars,
    # which have no axis 0. Reduce scalars over the replicas (axis=None) instead.
    import tensorflow as tf
    from keras.src import tree

    trainer = _trainer_module()
    original = _original(trainer, "reduce_per_replica")
    if reduction == "auto" and not isinstance(strategy, tf.distribute.TPUStrategy):
        reduction = "mean"
    if reduction != "mean" or not is_multi_worker(strategy):
        return original(values, strategy, reduction)

    def reduce_one(value: Any) -> Any:
        if _rank(strategy, value) == 0:
            return strategy.reduce("MEAN", value, axis=None)
        return original(value, strategy, reduction)

    return tree.map_structure(reduce_one, values)


# --- patch: backup_restore_sync ----------------------------------------------------------

def broadcast_from_replica_0(strategy: Any, tensors: list[Any]) -> list[Any]:
    """Every worker gets replica 0's (the chief's first device) values: one all-reduce.

    Every worker must call it at the same point with values of the same shapes and
    dtypes (a collective). Used by the ``backup_restore_sync`` patch below and by
    ``training.train.resume.broadcast`` (the callbacks' state after a restore)."""
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


def _backup_on_train_begin(self: Any, logs: Any = None) -> Any:
    # Keras 3's BackupAndRestore restores from this worker's own backup_dir; under
    # chief-only writes only the chief has one. Broadcast the chief's restored state so
    # every worker resumes from the same weights, optimizer state and epoch.
    import keras
    import numpy as np

    original = _original(keras.callbacks.BackupAndRestore, "on_train_begin")
    result = original(self, logs)
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


# --- probes: does the installed Keras still need each patch? -----------------------------

def _probe_strategy() -> Any:
    """A stand-in MultiWorkerMirroredStrategy in multi-worker mode that records reduces."""
    import tensorflow as tf

    class _Extended:
        def _in_multi_worker_mode(self) -> bool:
            return True

    class _Probe(tf.distribute.MultiWorkerMirroredStrategy):
        def __init__(self) -> None:  # no cluster, no collectives: a recorder
            self._extended = _Extended()
            self.reduces: list[tuple[str, Any, Any]] = []

        def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
            self.reduces.append((str(reduce_op), value, axis))
            return value

        def scope(self) -> Any:
            return contextlib.nullcontext()

        def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
            return tuple(getattr(value, "values", (value,)))

    return _Probe()


def _needs_symbolic_build() -> str | None:
    import tensorflow as tf
    from tensorflow.python.distribute import values as values_lib

    trainer = _trainer_module()
    probe = _probe_strategy()
    batch = values_lib.PerReplica((tf.zeros((2, 3)),))

    class _Trainer:
        _distribute_strategy = probe
        distribute_strategy = probe

        def _symbolic_build(self, data_batch: Any = None) -> None:
            self.built_from = data_batch

    def iterator() -> Iterator[tuple[int, int, Iterator[Any]]]:
        yield 0, 0, iter([batch])

    original = _original(trainer.TensorFlowTrainer, "_maybe_symbolic_build")
    original(_Trainer(), iterator=iterator())
    for op, value, _ in probe.reduces:
        if isinstance(value, tf.distribute.DistributedValues):
            return (f"TensorFlowTrainer._maybe_symbolic_build reduces the first distributed "
                    f"batch with strategy.reduce({op}) under MultiWorkerMirroredStrategy")
    return None


def _needs_reduce_scalar_logs() -> str | None:
    import tensorflow as tf

    trainer = _trainer_module()
    probe = _probe_strategy()
    original = _original(trainer, "reduce_per_replica")
    original({"loss": tf.constant(1.0)}, probe, "auto")
    for op, value, axis in probe.reduces:
        if axis is not None and getattr(value, "shape", None) is not None \
                and value.shape.rank == 0:
            return (f"reduce_per_replica reduces scalar logs with strategy.reduce({op}, "
                    f"axis={axis}) under MultiWorkerMirroredStrategy")
    return None


def _needs_backup_restore_sync() -> str | None:
    import inspect

    import keras

    source = inspect.getsource(keras.callbacks.BackupAndRestore)
    if any(word in source for word in ("distribute", "is_chief", "worker")):
        return None
    return "BackupAndRestore restores from each worker's own backup_dir, nothing synced"


_PROBES: dict[str, Callable[[], str | None]] = {
    "symbolic_build": _needs_symbolic_build,
    "reduce_scalar_logs": _needs_reduce_scalar_logs,
    "backup_restore_sync": _needs_backup_restore_sync,
}


def needed() -> dict[str, str]:
    """The patches the installed Keras still needs: ``{name: what its code does}``.

    Each probe runs Keras's own (unpatched) code path against a recording stand-in
    strategy; a probe that cannot run (Keras moved the code) counts as needed, with the
    error, so nothing is dropped silently. Safe before the strategy exists: it does
    not initialise the TensorFlow runtime.
    """
    import tensorflow as tf

    found = {}
    for name, probe in _PROBES.items():
        try:
            # In a graph of its own: eager tensors would initialise the TensorFlow
            # runtime, after which MultiWorkerMirroredStrategy can no longer configure
            # its collective ops ("must be configured at program startup").
            with tf.Graph().as_default():
                evidence = probe()
        except Exception as exc:  # noqa: BLE001 - any failure means: check by hand
            evidence = f"probe failed ({type(exc).__name__}: {exc}); check by hand"
        if evidence:
            found[name] = f"{evidence} [{ISSUES[name]}]"
    return found


# --- apply / remove ----------------------------------------------------------------------

def _patches() -> list[_Patch]:
    import keras

    trainer = _trainer_module()
    return [
        _Patch("symbolic_build", trainer.TensorFlowTrainer, "_maybe_symbolic_build",
               _maybe_symbolic_build),
        _Patch("reduce_scalar_logs", trainer, "reduce_per_replica", _reduce_per_replica),
        _Patch("backup_restore_sync", keras.callbacks.BackupAndRestore, "on_train_begin",
               _backup_on_train_begin),
    ]


def disabled() -> bool:
    """``TRAINING_KERAS_COMPAT=off`` (or 0, false, no): the whole layer is off."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("off", "0", "false", "no")


def skipped() -> set[str]:
    """``TRAINING_KERAS_COMPAT=without:NAME[,NAME]``: patches left out (to reproduce one
    upstream failure at a time); every name must be a patch's."""
    value = os.environ.get(DISABLE_ENV, "").strip()
    if not value.startswith("without:"):
        return set()
    names = {n.strip() for n in value.removeprefix("without:").split(",") if n.strip()}
    unknown = names - set(ISSUES) - {compat_steps.NAME}
    if unknown:
        from training.errors import ConfigError

        raise ConfigError(f"{DISABLE_ENV} names unknown patches {sorted(unknown)}; "
                          f"allowed: {', '.join([*ISSUES, compat_steps.NAME])}")
    return names


def enable() -> list[str]:
    """Install every patch the installed Keras needs; the names installed now.

    The patched functions only change behaviour for a strategy in multi-worker mode, so
    this is safe to call before the strategy exists (the multi-worker launcher's worker
    entry does). Idempotent.
    """
    if disabled():
        log.warning("Keras multi-worker compatibility layer disabled by %s=%s",
                    DISABLE_ENV, os.environ[DISABLE_ENV])
        return []
    if len(_originals) == len(_PROBES):
        return []  # everything installed already: nothing to probe again
    import keras

    still_needed = needed()
    leave_out = skipped()
    installed = []
    for patch in _patches():
        if patch.name in _originals:
            continue
        if patch.name in leave_out:
            log.warning("Keras multi-worker patch %r left out by %s=%s", patch.name,
                        DISABLE_ENV, os.environ[DISABLE_ENV])
            continue
        if patch.name not in still_needed:
            log.warning(
                "keras %s no longer needs the %r multi-worker workaround (%s): remove it "
                "from training/train/compat.py", keras.__version__, patch.name, ISSUES[patch.name])
            continue
        _originals[patch.name] = (patch.owner, patch.attribute,
                                  getattr(patch.owner, patch.attribute))
        setattr(patch.owner, patch.attribute, patch.replacement)
        installed.append(patch.name)
    if installed:
        log.info("Keras multi-worker compatibility patches applied: %s", ", ".join(installed))
    return installed


def apply(strategy: Any) -> list[str]:
    """Patch Keras for ``strategy``: its ``steps_per_execution`` loop
    (``compat_steps.py``) under any strategy with more than one replica but TPUStrategy,
    and the patches above under MultiWorkerMirroredStrategy; else nothing."""
    import tensorflow as tf

    installed = []
    if (getattr(strategy, "num_replicas_in_sync", 1) > 1
            and not isinstance(strategy, tf.distribute.TPUStrategy)
            and not compat_steps.installed() and not disabled()
            and compat_steps.NAME not in skipped()):
        if compat_steps.needed() is None:  # traced once the strategy exists, as it must be
            log.warning("keras no longer needs the %r workaround: remove "
                        "training/train/compat_steps.py", compat_steps.NAME)
        elif compat_steps.apply():
            installed.append(compat_steps.NAME)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        installed += enable()
    return installed


# remove(), active() and applied() are test seams: the unit tests install the patches,
# run Keras's real (patched) code paths in one process and undo them again.

def remove() -> None:
    """Undo every installed patch (for tests)."""
    compat_steps.remove()
    while _originals:
        _, (owner, attribute, original) = _originals.popitem()
        setattr(owner, attribute, original)


def active() -> list[str]:
    """The names of the patches installed now."""
    return sorted(_originals)


@contextlib.contextmanager
def applied(strategy: Any) -> Iterator[list[str]]:
    """``apply(strategy)`` for the duration of a block; removes what it installed."""
    installed = apply(strategy)
    try:
        yield installed
    finally:
        for name in installed:
            if name in _originals:
                owner, attribute, original = _originals.pop(name)
                setattr(owner, attribute, original)
            else:  # the steps_per_execution loop
                compat_steps.remove()
