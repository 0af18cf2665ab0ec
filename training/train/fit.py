"""Callbacks and strategy-scoped ``model.fit``: the ``train`` step.

``train`` builds, compiles and fits inside ``strategy.scope()`` and writes the run
directory (``<output_dir>/<run_id>/``; its files are named in ``training.layout``):
``model/`` (config, ``run.json``, the model and its SavedModel export, history,
TensorBoard events, ``trained.json`` last) and beside it the working state
(``checkpoints/``, ``backup/``).

``backup/`` holds the resumable state while training runs
(``training.train.callbacks.backup``), so a re-run with the same run id resumes after
the last finished epoch with the callbacks where they were; SIGTERM writes a backup and
exits 143 (``training.train.preemption``). ``backup/`` is removed once the model is
saved. Only the chief writes these files; other workers of a multi-worker run write to a
temporary directory that is removed. The chief records what it wrote in ``model/``
(``training.produced``): publish uploads that and nothing else.

Under 400 lines on purpose: the callbacks, the strategy-scoped fit (on either Keras
backend: ``strategy.resolve`` decides, ``training.backend`` holds the process to one) and
the run directory it writes are one step; apart, the order of its files (the record,
the marker last) would be split over modules.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training import backend, layout, produced
from training.config import FitConfig, RunConfig
from training.config.sections import monitor_rises
from training.data.input.choose import training_input
from training.data.snapshot import staging
from training.data.snapshot.staging import StagedDataset
from training.errors import ConfigError
from training.layout import TRAINED, model_dir
from training.locks import claim_run
from training.train import keras_patches, models, warm_start
from training.train.export import export, export_in_tensorflow
from training.train.models import pretrained
from training.train.placement import precision_policy
from training.train.strategy import resolve, steps_per_execution

log = logging.getLogger(__name__)


def make_callbacks(fit: FitConfig, run_dir: Path, tuning: Sequence[Any] = (),
                   restore_from: Path | None = None) -> list[Any]:
    """NaN guard, EarlyStopping, ReduceLROnPlateau, best checkpoint, CSV and TensorBoard
    logs, ``tuning`` (the fine-tuning schedule), backup: the logs after ReduceLROnPlateau,
    which adds the learning rate to each epoch's logs; the backup (``ResumableBackup``)
    after the callbacks whose state it saves and restores, the schedule just before it
    (why the order matters: ``training.train.callbacks.backup`` and ``fine_tune``).
    ``restore_from``: the chief's backup, for a worker of a JAX run of several processes."""
    import keras

    from training.train.callbacks.backup import ResumableBackup

    best = run_dir.joinpath(*layout.BEST_CHECKPOINT)
    best.parent.mkdir(parents=True, exist_ok=True)
    mode = "max" if monitor_rises(fit.early_stopping_monitor) else "min"
    early_stopping = keras.callbacks.EarlyStopping(
        monitor=fit.early_stopping_monitor,
        mode=mode,
        patience=fit.early_stopping_patience,
        min_delta=fit.early_stopping_min_delta,
        restore_best_weights=fit.restore_best_weights,
        verbose=1,
    )
    reduce_lr = keras.callbacks.ReduceLROnPlateau(
        monitor=fit.early_stopping_monitor,
        mode=mode,
        factor=fit.reduce_lr_factor,
        patience=fit.reduce_lr_patience,
        min_lr=fit.min_lr,
        verbose=1,
    )
    checkpoint = keras.callbacks.ModelCheckpoint(
        os.fspath(best),
        monitor=fit.early_stopping_monitor,
        mode=mode,
        save_best_only=True,
    )
    return [
        keras.callbacks.TerminateOnNaN(),
        early_stopping,
        reduce_lr,
        checkpoint,
        keras.callbacks.CSVLogger(os.fspath(model_dir(run_dir) / layout.HISTORY_CSV),
                                  append=True),
        tensorboard(model_dir(run_dir) / layout.TENSORBOARD_DIR),
        *tuning,
        ResumableBackup(run_dir / layout.BACKUP_DIR, early_stopping=early_stopping,
                        reduce_lr=reduce_lr, checkpoint=checkpoint,
                        min_interval_s=fit.backup_interval_s, restore_from=restore_from),
    ]


def tensorboard(log_dir: Path) -> Any:
    """The TensorBoard log of epoch scalars: Keras's callback under TensorFlow, the
    TF-free ``EpochScalars`` under JAX (the same directories and tags)."""
    import keras

    if keras.backend.backend() != "tensorflow":
        from training.train.callbacks.epoch_scalars import EpochScalars

        return EpochScalars(log_dir)
    return keras.callbacks.TensorBoard(os.fspath(log_dir), update_freq="epoch",
                                       write_graph=False, profile_batch=0)


def software_versions() -> dict[str, str]:
    """What trained the model: the backend's versions (a JAX process imports no
    TensorFlow, so none is recorded for it)."""
    import keras

    import training

    versions = {"python": platform.python_version(), "keras": keras.__version__,
                "keras_backend": keras.backend.backend(), "training": training.__version__}
    if keras.backend.backend() == "jax":
        import jax

        return {**versions, "jax": jax.__version__, "jaxlib": _version("jaxlib")}
    import tensorflow as tf
    import tensorflow_datasets as tfds

    return {**versions, "tensorflow": tf.__version__,
            "tensorflow_datasets": tfds.__version__}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class TrainResult:
    run_dir: str
    model_path: str
    saved_model_path: str
    epochs_run: int
    best_epoch: int | None
    stopped_epoch: int | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _history_summary(epochs: list[int], metrics: dict[str, list[float]],
                     stopper: Any) -> dict[str, Any]:
    """history.json: ``epochs`` 0-based (as Keras's History), every epoch of the run;
    ``stopper``: the run's EarlyStopping."""
    metrics = {k: [float(v) for v in vals] for k, vals in metrics.items()}
    lrs = metrics.get("learning_rate", [])
    epochs = list(epochs)
    return {
        "epochs": [e + 1 for e in epochs],
        "metrics": metrics,
        "lr_reduced_at_epochs": [
            epochs[i] + 1 for i in range(1, len(lrs)) if lrs[i] < lrs[i - 1]
        ],
        "early_stopping": {
            "monitor": stopper.monitor,
            "stopped_epoch": stopper.stopped_epoch + 1 if stopper.stopped_epoch else None,
            "best_epoch": stopper.best_epoch + 1 if stopper.best_weights is not None else None,
            "best_value": float(stopper.best) if stopper.best_weights is not None else None,
            "restored_best_weights": bool(stopper.restore_best_weights
                                          and stopper.best_weights is not None),
        },
    }


def _started_at(run_json: Path) -> str:
    """When this run first started: kept across retries, so a resumed run's published
    ``run.json`` and version ``created`` time are those of its first try."""
    if run_json.is_file():
        with contextlib.suppress(ValueError, KeyError):
            return json.loads(run_json.read_text())["started_at"]
    return datetime.now(UTC).isoformat(timespec="seconds")


def already_trained(cfg: RunConfig) -> TrainResult | None:
    """The finished training of this run, if there is one; ConfigError if the run
    directory holds a model trained with settings that change the model."""
    out = model_dir(cfg.run_dir())
    if not (out / TRAINED).is_file():
        return None
    try:
        done = json.loads((out / TRAINED).read_text())
        result = TrainResult(**done["result"])
        fingerprint = done["config_fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{out / TRAINED} is unreadable ({exc}); the run directory "
                          f"{cfg.run_dir()} is damaged: use a new run id") from None
    if fingerprint != cfg.fingerprint():
        raise ConfigError(
            f"run {cfg.run_id} was already trained with other settings (config fingerprint "
            f"{fingerprint}, these give {cfg.fingerprint()}; see {out / layout.CONFIG}): "
            "a finished run is never retrained; use a new run id")
    return result


def train(cfg: RunConfig, staged: StagedDataset, *,
          extra_callbacks: Sequence[Any] = ()) -> TrainResult:
    """Fit the configured model on a staged dataset; write the outputs (chief only).

    A run that finished training (``model/trained.json``) is not trained again: the
    result is returned as it was. The chief holds the run directory's claim
    (``training.locks``) while it trains.

    ``extra_callbacks`` run after the project's own (the launcher's weights report, the
    benchmarks' timers).
    """
    backend.use(cfg.runtime.backend)  # refused when this process's Keras runs another
    done = already_trained(cfg)  # every worker, before any strategy exists
    if done is not None:
        log.info("run %s is already trained (%d epochs, best epoch %s): nothing to do; "
                 "its model stays at %s", cfg.run_id, done.epochs_run, done.best_epoch,
                 done.model_path)
        return done
    import keras

    keras.utils.set_random_seed(cfg.fit.seed)
    resolved = resolve(cfg)
    if not resolved.is_chief:
        return _train(cfg, staged, resolved, extra_callbacks)
    with claim_run(cfg.run_dir(), cfg.run_id):
        done = already_trained(cfg)  # finished while we waited for the claim
        return done if done is not None else _train(cfg, staged, resolved, extra_callbacks)


def _train(cfg: RunConfig, staged: StagedDataset, resolved: Any,
           extra_callbacks: Sequence[Any]) -> TrainResult:
    import keras

    from training.train.callbacks.backup import ResumableBackup
    from training.train.preemption import stop_on_sigterm

    if resolved.backend == "tensorflow":
        keras_patches.install_for(resolved.strategy)  # more than one replica; else none
    # ``auto`` depends on the accelerator found (placement.precision_policy); before the
    # model is built.
    policy, why = precision_policy(cfg.runtime.mixed_precision,
                                   resolved.details.get("accelerator") or {})
    keras.mixed_precision.set_global_policy(policy)
    log.info("precision %s (%s)", policy, why)
    staging.verify(staged)  # before any training: a corrupted shard stops here

    final_dir = cfg.run_dir()
    run_dir = final_dir if resolved.is_chief else Path(tempfile.mkdtemp(prefix="worker-"))
    out = model_dir(run_dir)

    batch = resolved.global_batch_size
    # The input, asked once: the splits as fit takes them (training.data.input.choose).
    inputs = training_input(staged, cfg.dataset, global_batch_size=batch,
                            seed=cfg.fit.seed, on_device=resolved.backend == "jax")
    info = inputs.model_info

    with resolved.scope():
        model = models.build(cfg.model.name, info["input_shape"], info["num_classes"],
                             cfg.model.args)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=resolved.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution(cfg.fit.steps_per_execution,
                                                    resolved.kind),
            # JAX runs every step compiled (runtime.jit_compile is TensorFlow's switch)
            jit_compile=True if resolved.backend == "jax" else cfg.runtime.jit_compile,
        )
        weights, tuning = pretrained.prepare(cfg.model, model)
    loop = None  # Keras's own loop: the split is on the host
    if resolved.backend == "jax":
        from training.train import fused_steps
        from training.train.jax_distribution import check_layout

        check_layout(cfg, resolved, model)
        if inputs.device_split is not None:  # the split is there
            loop = fused_steps.install(model, inputs.device_split)
    # model.warm_start: production's weights as the start (training.train.warm_start).
    warm = warm_start.start(cfg, model, resolved, final_dir)
    # Written once every refusal is behind (the model built, its layout checked, its
    # start weights fitted): a refused run leaves no run directory.
    out.mkdir(parents=True, exist_ok=True)
    cfg.write(out)
    (out / layout.RUN).write_text(json.dumps({
        "run_id": cfg.run_id,
        "started_at": _started_at(out / layout.RUN),
        "dataset": staged.to_dict(),
        "strategy": resolved.to_dict(),
        "input": {"train": "device" if inputs.device_split is not None else "host",
                  "decoded_copy": cfg.dataset.decoded_copy, "loop": loop},
        "precision": {"policy": policy, "why": why},
        "software": software_versions(),
        "pretrained_weights": weights,
        "warm_start": warm,
    }, indent=2) + "\n")
    # Under JAX every process loads the chief's backup itself (an assignment is a
    # collective there); under TensorFlow the chief's is broadcast (keras_patches).
    chiefs = final_dir / layout.BACKUP_DIR
    restore_from = chiefs if resolved.backend == "jax" and not resolved.is_chief else None
    from training.train.callbacks.throughput import Throughput, summary

    throughput = Throughput(inputs.train_examples, batch)  # first: its logs
    callbacks = [throughput, *make_callbacks(cfg.fit, run_dir, tuning, restore_from),
                 *extra_callbacks]
    backup = next(c for c in callbacks if isinstance(c, ResumableBackup))
    log.info("training %s on %s for up to %d epochs", cfg.model.name, staged.key,
             cfg.fit.epochs)
    # SIGTERM: a backup at the end of the current batch, then exit 143; not under several
    # workers, where one worker cannot save for all (training.train.preemption).
    with stop_on_sigterm(backup, enabled=not resolved.several_processes):
        model.fit(inputs.train, validation_data=inputs.validation, epochs=cfg.fit.epochs,
                  callbacks=callbacks, verbose=2,
                  shuffle=False)  # the tf.data pipeline shuffles, seeded

    # The whole run's history, epochs before a restart included (History only has
    # this process's).
    history = _history_summary(backup.epochs, backup.metrics, backup.early_stopping)
    (out / layout.HISTORY).write_text(json.dumps(history, indent=2) + "\n")
    record = json.loads((out / layout.RUN).read_text())
    record["throughput"] = summary(history["metrics"], throughput.memory_source,
                                   resolved.details.get("accelerator"))
    (out / layout.RUN).write_text(json.dumps(record, indent=2) + "\n")
    model.save(out / layout.MODEL_FILE)
    saved_model_path = out / layout.SAVED_MODEL_DIR
    if saved_model_path.exists():
        shutil.rmtree(saved_model_path)  # a retry replaces a half-written export
    if resolved.backend == "tensorflow":
        export(model, saved_model_path)  # serving signature: training.train.export
    elif resolved.is_chief:  # made where TensorFlow is: a child process of its own
        export_in_tensorflow(out / layout.MODEL_FILE, saved_model_path, cfg.model.name)
    es = history["early_stopping"]
    result = TrainResult(
        run_dir=os.fspath(final_dir),
        model_path=os.fspath(model_dir(final_dir) / layout.MODEL_FILE),
        saved_model_path=os.fspath(model_dir(final_dir) / layout.SAVED_MODEL_DIR),
        epochs_run=len(history["epochs"]),
        best_epoch=es["best_epoch"],
        stopped_epoch=es["stopped_epoch"],
    )
    if resolved.is_chief:  # written last: the run is trained
        produced.record(run_dir, "train", produced.TRAIN)  # what publish uploads
        marker = out / TRAINED
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps({"config_fingerprint": cfg.fingerprint(),
                                   "result": result.to_dict()}, indent=2) + "\n")
        os.replace(tmp, marker)
        produced.record(run_dir, "train", produced.TRAIN)  # with the marker, there now
    shutil.rmtree(run_dir / layout.BACKUP_DIR, ignore_errors=True)  # the model is saved: done
    if not resolved.is_chief:
        shutil.rmtree(run_dir, ignore_errors=True)
    log.info("trained %d epochs (best epoch %s); model at %s", result.epochs_run,
             es["best_epoch"], result.model_path)
    return result
