"""The Keras patches this project needs, in one registry, installed for a strategy.

With tensorflow 2.21 and keras 3.15, ``model.fit`` under more than one replica breaks in
four places of Keras's TensorFlow trainer. Each patch is a module of its own that says
what breaks, the upstream issue, what it does instead, and holds its probe:

- ``symbolic_build``: building the model reduces the first distributed batch, which
  fails under MultiWorkerMirroredStrategy (keras-team/keras#20585);
- ``reduce_scalar_logs``: the logs are reduced along an axis scalars lack, same
  strategy, same issue;
- ``backup_restore_sync``: BackupAndRestore restores each worker from its own backup,
  so after an interruption the workers diverge; the chief's state is broadcast;
- ``steps_in_cond`` (``spe_collectives_in_cond``): the ``steps_per_execution`` loop
  drops the collectives' call-time captures under any strategy with more than one
  replica (MirroredStrategy too).

``install_for(strategy)`` installs what the strategy needs (``REPLICATED`` patches for
more than one replica but TPUStrategy, ``MULTI_WORKER`` ones for MultiWorkerMirroredStrategy;
``fit.train`` calls it); ``enable()`` installs the multi-worker ones before the strategy
exists (a worker of a multi-worker run calls it first). Every replacement still hands
over to Keras's own code unless the strategy it meets is one it is for.

Each patch's probe runs Keras's own, unpatched code path and says whether the installed
Keras still needs it: a patch Keras no longer needs is not installed, with a WARNING, and
``tests/unit/test_keras_patches.py`` fails naming it, so whoever upgrades Keras retires it.
``TRAINING_KERAS_COMPAT=off`` disables them all, ``TRAINING_KERAS_COMPAT=without:NAME,...``
leaves out single ones (to reproduce an upstream failure;
``tests/integration/test_multiworker.py`` does).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from training.train.keras_patches import (
    backup_restore_sync,
    reduce_scalar_logs,
    steps_in_cond,
    symbolic_build,
)
from training.train.keras_patches.patch import (
    MULTI_WORKER,
    REPLICATED,
    Patch,
    install,
    installed,
    is_multi_worker,
    uninstall,
)

__all__ = ["DISABLE_ENV", "PATCHES", "applied", "disabled", "enable", "install_for",
           "installed", "is_multi_worker", "needed", "remove", "skipped"]

log = logging.getLogger(__name__)

DISABLE_ENV = "TRAINING_KERAS_COMPAT"
PATCHES: dict[str, Patch] = {p.name: p for p in (
    symbolic_build.PATCH, reduce_scalar_logs.PATCH, backup_restore_sync.PATCH,
    steps_in_cond.PATCH)}


def disabled() -> bool:
    """``TRAINING_KERAS_COMPAT=off`` (or 0, false, no): no patch is installed."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("off", "0", "false", "no")


def skipped() -> set[str]:
    """``TRAINING_KERAS_COMPAT=without:NAME[,NAME]``: patches left out; every name must be
    a patch's."""
    value = os.environ.get(DISABLE_ENV, "").strip()
    if not value.startswith("without:"):
        return set()
    names = {n.strip() for n in value.removeprefix("without:").split(",") if n.strip()}
    unknown = names - set(PATCHES)
    if unknown:
        from training.errors import ConfigError

        raise ConfigError(f"{DISABLE_ENV} names unknown patches {sorted(unknown)}; "
                          f"allowed: {', '.join(PATCHES)}")
    return names


def needed(scope: str = MULTI_WORKER) -> dict[str, str]:
    """The patches of ``scope`` the installed Keras still needs: ``{name: evidence}``.

    Each probe runs in a graph of its own (eager tensors would initialise the TensorFlow
    runtime, after which MultiWorkerMirroredStrategy can no longer configure its
    collectives); a probe that cannot run (Keras moved the code) counts as needed, with
    the error, so nothing is dropped silently. The ``REPLICATED`` probe traces control
    flow, which initialises the runtime anyway: ask for it once the strategy exists.
    """
    import tensorflow as tf

    found = {}
    for name, patch in PATCHES.items():
        if patch.scope != scope:
            continue
        try:
            with tf.Graph().as_default():
                evidence = patch.probe()
        except Exception as exc:  # noqa: BLE001 - any failure means: check by hand
            evidence = f"probe failed ({type(exc).__name__}: {exc}); check by hand"
        if evidence:
            found[name] = f"{evidence} [{patch.issue}]"
    return found


def _install(scope: str) -> list[str]:
    """Install every patch of ``scope`` that Keras still needs and is not left out."""
    if disabled():
        log.warning("Keras patches disabled by %s=%s", DISABLE_ENV, os.environ[DISABLE_ENV])
        return []
    todo = [p for p in PATCHES.values() if p.scope == scope and p.name not in installed()]
    if not todo:
        return []  # everything installed already: nothing to probe again
    import keras

    leave_out, still_needed, done = skipped(), needed(scope), []
    for patch in todo:
        if patch.name in leave_out:
            log.warning("Keras patch %r left out by %s=%s", patch.name, DISABLE_ENV,
                        os.environ[DISABLE_ENV])
        elif patch.name not in still_needed:
            log.warning("keras %s no longer needs the %r patch (%s): remove %s",
                        keras.__version__, patch.name, patch.issue,
                        patch.replacement.__module__)
        elif install(patch):
            done.append(patch.name)
    if done:
        log.info("Keras patches installed: %s", ", ".join(done))
    return done


def enable() -> list[str]:
    """Install the multi-worker patches now, before the strategy exists (they only
    change behaviour under a strategy in multi-worker mode); the names installed."""
    return _install(MULTI_WORKER)


def install_for(strategy: Any) -> list[str]:
    """Install what ``strategy`` needs: the replicated patches for more than one replica
    but TPUStrategy, the multi-worker ones for MultiWorkerMirroredStrategy; else none."""
    import tensorflow as tf

    done = []
    if (getattr(strategy, "num_replicas_in_sync", 1) > 1
            and not isinstance(strategy, tf.distribute.TPUStrategy)):
        done += _install(REPLICATED)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        done += _install(MULTI_WORKER)
    return done


# remove() and applied() are test seams: the unit tests install the patches, run Keras's
# real (patched) code paths in one process and undo them again.

def remove() -> None:
    """Undo every installed patch."""
    for name in installed():
        uninstall(name)


@contextlib.contextmanager
def applied(strategy: Any) -> Iterator[list[str]]:
    """``install_for(strategy)`` for the duration of a block; removes what it installed."""
    done = install_for(strategy)
    try:
        yield done
    finally:
        for name in done:
            uninstall(name)
