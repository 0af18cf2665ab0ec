"""What a Keras patch is, and the one registry of the patches installed now.

A ``Patch`` names the attribute of Keras it replaces, the replacement, the upstream
issue, when it applies (``scope``) and its probe: a function that runs Keras's own,
unpatched code path and returns evidence that it still fails (a string), or None once
the installed Keras no longer needs the patch. ``install`` and ``uninstall`` keep the
original of every replaced attribute here, so a replacement hands over to Keras's own
code (``original``) whether or not other patches are installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Where a patch applies: under MultiWorkerMirroredStrategy in multi-worker mode only, or
# under any strategy with more than one replica but TPUStrategy.
MULTI_WORKER, REPLICATED = "multi_worker", "replicated"


@dataclass(frozen=True)
class Patch:
    """One replaced attribute of Keras, with its reason and its probe."""

    name: str
    issue: str  # the upstream report, or what Keras does
    scope: str  # MULTI_WORKER or REPLICATED
    target: Callable[[], tuple[Any, str]]  # (owner, attribute), looked up when installed
    replacement: Callable[..., Any]
    probe: Callable[[], str | None]
    # The probe traces v2 control flow, which initialises the TensorFlow runtime: it may
    # only run once the strategy exists (MultiWorkerMirroredStrategy must come first).
    probe_after_strategy: bool = False


_originals: dict[str, tuple[Any, str, Any]] = {}  # patch name -> (owner, attribute, original)


def trainer_module() -> Any:
    """Keras's TensorFlow trainer (``keras/src/backend/tensorflow/trainer.py``)."""
    from keras.src.backend.tensorflow import trainer

    return trainer


def original(owner: Any, attribute: str) -> Any:
    """The unpatched attribute, whether or not a patch of it is installed now."""
    for own, attr, value in _originals.values():
        if own is owner and attr == attribute:
            return value
    return getattr(owner, attribute)


def install(patch: Patch) -> bool:
    """Replace the patch's attribute; False when it is installed already."""
    if patch.name in _originals:
        return False
    owner, attribute = patch.target()
    _originals[patch.name] = (owner, attribute, getattr(owner, attribute))
    setattr(owner, attribute, patch.replacement)
    return True


def uninstall(name: str) -> None:
    """Put the original back (nothing when the patch is not installed)."""
    if name in _originals:
        owner, attribute, value = _originals.pop(name)
        setattr(owner, attribute, value)


def installed() -> list[str]:
    """The names of the patches installed now."""
    return sorted(_originals)


def is_multi_worker(strategy: Any) -> bool:
    """True for a MultiWorkerMirroredStrategy that spans more than one worker."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    return bool(strategy.extended._in_multi_worker_mode())
