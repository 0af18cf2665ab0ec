"""Warm start (``model.warm_start``): the night's model begins at production's weights.

Which weights a run starts from is decided once per run, checked against the model the
run built, and recorded in ``run.json`` (``warm_start``), from where the report and the
promotion history (``registry.pointer``) say it. The rules:

- **off**: nothing here runs; ``run.json`` records ``"warm_start": null``.
- **nothing in production** for the run's model name: the run trains from fresh
  weights and says so (a WARNING, and the record's ``note``: "no production model to
  warm-start from"), as the first night of a model must.
- **a production version**: it is downloaded through the registry, every file checked
  against its manifest, and loaded with ``safe_mode`` (``ModelRegistry.load_model``, as
  ``evaluate`` loads the champion); its architecture is compared with this run's model
  (input shape, output shape, the layers in order by kind, every weight's shape). A
  difference is refused before any training with a ConfigError naming the setting, the
  version and the first difference; otherwise the model starts at every one of its
  weights (BatchNormalization statistics included). The optimizer starts fresh, and the
  learning-rate schedule and early stopping run as in any run.
- **a retry** of the run starts from the version its first try recorded (production may
  have moved since); a run that **resumes** from its backup loads nothing: its backup's
  weights are restored instead (``callbacks.backup``).
- **several workers**: each does the same, reading ``run.json`` and the backup where
  the chief writes them (the run directory); when training begins, the chief's weights
  are broadcast to every worker (``keras_patches.backup_restore_sync``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from itertools import zip_longest
from pathlib import Path
from typing import Any

from training import files, layout
from training.config import RunConfig
from training.errors import ConfigError, RegistryError, StorageError

log = logging.getLogger(__name__)

SETTING = "model.warm_start"
NO_PRODUCTION = "no production model to warm-start from"


def _plain(shape: Any) -> Any:
    """A Keras shape (tuples, or lists of them for several inputs) as nested tuples."""
    if isinstance(shape, (list, tuple)):
        return tuple(_plain(s) for s in shape)
    return shape


def architecture(model: Any) -> dict[str, Any]:
    """What must match for one model to start from another's weights: the input and
    output shapes and, layer by layer, its kind, name and weight shapes."""
    return {
        "input shape": _plain(model.input_shape),
        "output shape (classes)": _plain(model.output_shape),
        "layers": [(type(layer).__name__, layer.name,
                    [tuple(w.shape) for w in layer.weights]) for layer in model.layers],
    }


def _shapes(weights: list[tuple[int, ...]]) -> str:
    return ", ".join(str(s) for s in weights) or "none"


def difference(production: Any, model: Any) -> str | None:
    """The first way ``model`` differs from ``production`` in architecture, in words;
    None when ``production``'s weights fit it one for one."""
    theirs, ours = architecture(production), architecture(model)
    for what in ("input shape", "output shape (classes)"):
        if theirs[what] != ours[what]:
            return (f"the {what} differs: production's is {theirs[what]}, this run's "
                    f"model's {ours[what]}")
    layers = zip_longest(theirs["layers"], ours["layers"])
    for index, (prod, mine) in enumerate(layers):
        if prod is None or mine is None:
            more, extra = ("this run's model", mine) if prod is None else ("production",
                                                                            prod)
            return (f"{more} has more layers ({len(theirs['layers'])} in production, "
                    f"{len(ours['layers'])} in this run's model): layer {index} is "
                    f"{extra[0]} {extra[1]!r}")
        if prod[0] != mine[0]:
            return (f"layer {index} is {prod[0]} {prod[1]!r} in production, {mine[0]} "
                    f"{mine[1]!r} in this run's model")
        if prod[2] != mine[2]:
            return (f"layer {index} ({mine[0]} {mine[1]!r}) has weight shapes "
                    f"{_shapes(prod[2])} in production, {_shapes(mine[2])} in this run's "
                    "model")
    return None


def resuming(run_dir: Path) -> bool:
    """Whether training will resume from the run's backup (what ``ResumableBackup``
    restores, an interrupted swap included), read without moving anything."""
    from training.train.resume import STATE_FILE, WEIGHTS_FILE  # imports Keras

    backup = files.settled_dir(run_dir / layout.BACKUP_DIR, last_file=STATE_FILE)
    return backup is not None and (backup / WEIGHTS_FILE).is_file()


def earlier_record(run_dir: Path) -> dict[str, Any] | None:
    """The warm start an earlier try of this run recorded in its ``run.json``, or None
    (a first try, or a record that is unreadable or not a warm start's)."""
    try:
        record = json.loads((layout.model_dir(run_dir) / layout.RUN).read_text())
    except (OSError, ValueError):
        return None
    found = record.get("warm_start") if isinstance(record, dict) else None
    return found if isinstance(found, dict) and "from_version" in found else None


def start(cfg: RunConfig, model: Any, placement: Any, run_dir: str | os.PathLike[str],
          registry: Any = None) -> dict[str, Any] | None:
    """Apply ``model.warm_start`` to the built ``model`` of run ``cfg`` whose directory
    is ``run_dir``; the record for ``run.json`` (None when the setting is off).
    ``placement``: where the model was built (``strategy.Resolved``: its ``scope()``),
    so that the weights are set on its devices, whatever backend trained production.

    ``registry``: the model registry (default: the config's store). ConfigError, before
    any training, when production's architecture differs; the registry's own errors,
    naming the setting, when production cannot be read or verified.
    """
    if not cfg.model.warm_start:
        return None
    run_dir, name = Path(run_dir), cfg.model_name
    earlier = earlier_record(run_dir)
    if resuming(run_dir):
        log.info("%s: resuming from the run's backup, whose weights are restored; "
                 "production's are not loaded again", SETTING)
        return earlier or {"from_version": None,
                           "note": "resumed from its backup; its first try's warm start "
                                   "was not recorded"}
    if registry is None:
        from training.registry.versions import open_registry

        registry = open_registry(cfg.storage.store_uri)
    if earlier is not None:
        version = earlier["from_version"]
        log.info("%s: a retry starts where the run's first try did (%s)", SETTING,
                 version or "fresh weights")
    else:
        version = registry.production(name)
    if version is None:
        note = (f"{NO_PRODUCTION}: model {name!r} has nothing in production in "
                f"{registry.store.uri}; trained from fresh weights")
        log.warning("%s: %s", SETTING, note)
        return {"from_version": None, "note": note}
    weights, digest = _production_weights(registry, name, version, model)
    with placement.scope():
        model.set_weights(weights)
    note = f"warm-started from {version}, the production version of {name}"
    log.info("%s: %s (model.keras SHA-256 %s)", SETTING, note, digest)
    return {"from_version": version, "model_sha256": digest, "note": note}


def _production_weights(registry: Any, name: str, version: str,
                        model: Any) -> tuple[list[Any], str]:
    """Production's weights (verified, safely loaded) and its model file's SHA-256;
    ConfigError when they do not fit ``model``."""
    with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        try:
            production = registry.load_model(name, version, tmp)
        except (RegistryError, StorageError) as exc:
            raise type(exc)(f"{SETTING}: cannot start from production version "
                            f"{version!r} of model {name!r}: {exc}") from exc
        digest = files.sha256_file(Path(tmp) / layout.MODEL_FILE)
    why = difference(production, model)
    if why is not None:
        raise ConfigError(
            f"{SETTING} is true, but this run's model does not fit production version "
            f"{version!r} of model {name!r}: {why}; keep production's architecture (the "
            "same model, model_args, image shape and classes), or set model.warm_start "
            "false to train from fresh weights")
    return production.get_weights(), digest
