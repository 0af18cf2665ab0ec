"""Strategy resolution, device selection, global batch and learning-rate scaling.

This module decides for both Keras backends: ``resolve`` builds a ``tf.distribute``
strategy for ``runtime.backend`` ``tensorflow`` (below) and hands ``jax`` to
``training.train.jax_distribution`` (a ``keras.distribution``); either way the result is
a ``Resolved``, recorded in ``run.json`` the same way.

``choose_kind`` is the decision (pure, every branch unit-tested); ``resolve`` probes the
machine (TPU resolver, ``TF_CONFIG``, visible GPUs), calls it, and builds the
``tf.distribute`` strategy. ``auto`` picks, in order:

1. ``tpu`` when a TPU resolver answers (only tried when a TPU is named or the host
   looks like a TPU VM, so a plain machine never waits on a metadata server);
2. ``multi_worker`` when ``TF_CONFIG`` names more than one worker;
3. ``mirrored`` when more than one GPU is selected;
4. ``one_device`` otherwise (the first selected GPU, else the CPU).
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Callable
from typing import Any

from training.config import RunConfig, RuntimeConfig
from training.errors import ConfigError, shown
from training.train import cluster  # TF_CONFIG: the one place that reads it
from training.train.placement import (  # noqa: F401  (check_devices: tests import it here)
    Resolved,
    check_devices,
    not_a_worker,
    scaled_learning_rate,
    select_devices,
)

log = logging.getLogger(__name__)

KINDS = ("one_device", "mirrored", "multi_worker", "tpu")


def choose_kind(requested: str, *, tpu_available: bool, workers_in_tf_config: int,
                gpus: int) -> str:
    """The strategy kind for a request, given what the machine offers."""
    if requested != "auto":
        if requested not in KINDS:
            raise ConfigError(
                f"runtime.strategy must be one of auto, {', '.join(KINDS)}, got {requested!r}"
            )
        return requested
    if tpu_available:
        return "tpu"
    if workers_in_tf_config > 1:
        return "multi_worker"
    if gpus > 1:
        return "mirrored"
    return "one_device"


def _looks_like_tpu_host() -> bool:
    return bool(os.environ.get("TPU_NAME")) or os.path.exists("/dev/accel0") or os.path.exists(
        "/dev/vfio/0"
    )


def default_tpu_resolver(tpu: str) -> Any:
    import tensorflow as tf

    return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or None)


def resolve(
    cfg: RunConfig,
    *,
    tpu_resolver: Callable[[str], Any] = default_tpu_resolver,
) -> Resolved:
    """Build the strategy the config asks for; log and return the effective values.
    Under ``runtime.backend`` ``jax``: ``jax_distribution.resolve``.

    ``tpu_resolver`` is a test seam: tests/unit/test_strategy.py passes a resolver that
    points at a real local TensorFlow server, so the TPU branch (connect, initialise,
    report a missing TPU) runs for real on a machine without a TPU.
    """
    if cfg.runtime.backend == "jax":
        from training.train import jax_distribution

        return jax_distribution.resolve(cfg)
    import tensorflow as tf

    runtime = cfg.runtime
    tf_config = cluster.current()
    resolver = None
    if runtime.strategy == "tpu" or (
        runtime.strategy == "auto" and (runtime.tpu or _looks_like_tpu_host())
    ):
        try:
            resolver = tpu_resolver(runtime.tpu)
        except Exception as exc:  # ValueError, RuntimeError, URLError from the metadata server
            if runtime.strategy == "tpu" or runtime.tpu:  # asked for by name: no fallback
                asked = ("runtime.strategy is 'tpu'" if runtime.strategy == "tpu"
                         else "runtime.tpu names a TPU")
                raise ConfigError(
                    f"{asked} but no TPU answered for runtime.tpu={runtime.tpu!r}: "
                    f"{type(exc).__name__}: {shown(exc)}"
                ) from None
            log.info("no TPU answered (%s); looking for other devices", exc)
    if runtime.workers > 1 and cluster.workers(tf_config) <= 1:
        raise not_a_worker(runtime.workers, tf_config)
    gpu_names = [f"/gpu:{i}" for i in range(len(tf.config.list_physical_devices("GPU")))]
    # Listing devices starts TF's runtime, which must not happen before a multi-worker
    # strategy configures its collectives.
    if runtime.devices and runtime.workers <= 1 and cluster.workers(tf_config) <= 1:
        check_devices(list(runtime.devices),
                      [d.name for d in tf.config.list_logical_devices()])
    devices = select_devices(runtime, gpu_names)
    kind = choose_kind(
        runtime.strategy,
        tpu_available=resolver is not None,
        workers_in_tf_config=cluster.workers(tf_config),
        gpus=sum(1 for d in devices if "gpu" in d.lower()),
    )
    if kind == "tpu":
        strategy = _tpu_strategy(resolver, runtime.tpu)
    elif kind == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=communication_options(runtime, gpus=len(gpu_names)))
    elif kind == "mirrored":
        strategy = tf.distribute.MirroredStrategy(devices=devices)
    else:
        strategy = _one_device(runtime, devices[0])
    replicas = strategy.num_replicas_in_sync
    resolved = Resolved(
        strategy=strategy,
        kind=kind,
        devices=devices if kind in ("one_device", "mirrored") else [],
        replicas=replicas,
        global_batch_size=cfg.fit.batch_size * replicas,
        learning_rate=scaled_learning_rate(cfg.fit.learning_rate, cfg.fit.lr_scaling, replicas),
        is_chief=cluster.is_chief(tf_config),
        details={"accelerator": _accelerator(kind, replicas, devices)},
    )
    log.info(
        "strategy %s on %s: %d replicas, global batch %d (%d per replica), "
        "learning rate %g (%s scaling of %g)",
        kind, resolved.devices or "the cluster", replicas, resolved.global_batch_size,
        cfg.fit.batch_size, resolved.learning_rate, cfg.fit.lr_scaling, cfg.fit.learning_rate,
    )
    return resolved


def communication_options(runtime: RuntimeConfig, *, gpus: int) -> Any:
    """The ``CommunicationOptions`` of a MultiWorkerMirroredStrategy: the collective
    timeout, the all-reduce implementation and the gradient pack size.

    They are the strategy's defaults, and Keras 3's optimizer all-reduces the gradients
    through ``ReplicaContext.all_reduce`` without options of its own, so they reach
    fit's gradients (docs/multiworker.md, "Communication options"). ``gpus``: the GPUs
    this worker sees. TensorFlow accepts ``nccl`` without a GPU, logs a warning and
    runs its ring instead; that is refused here, on every worker, so a run that asked
    for NCCL never trains on something else.
    """
    import tensorflow as tf

    if runtime.all_reduce == "nccl" and not gpus:
        raise ConfigError(
            "runtime.all_reduce is 'nccl', which needs a GPU on every worker, but this "
            "worker sees none; use 'auto' or 'ring' (allowed: auto, ring, nccl)")
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=runtime.gradient_pack_mb * 1024 * 1024,
        timeout_seconds=runtime.collective_timeout_s or None,  # a peer that never answers
        implementation=tf.distribute.experimental.CommunicationImplementation[
            runtime.all_reduce.upper()],  # AUTO, RING, NCCL
    )


def _accelerator(kind: str, replicas: int, devices: list[str]) -> dict[str, Any]:
    """What trains: the platform, the device's name, how many, a GPU's compute
    capability (``placement.precision_policy`` reads it)."""
    import tensorflow as tf

    if kind == "tpu":
        return {"platform": "tpu", "name": "TPU", "count": replicas, "compute_capability": None}
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and (kind == "multi_worker" or any("gpu" in d.lower() for d in devices)):
        details = tf.config.experimental.get_device_details(gpus[0])
        capability = details.get("compute_capability")
        return {"platform": "gpu", "name": details.get("device_name", "GPU"),
                "count": replicas if kind != "multi_worker" else len(gpus),
                "compute_capability": ".".join(map(str, capability)) if capability else None}
    return {"platform": "cpu", "name": platform.processor() or platform.machine() or "cpu",
            "count": 1, "compute_capability": None}


def _one_device(runtime: RuntimeConfig, device: str) -> Any:
    """One replica: pinned to a device that was asked for, else TF's default strategy.

    The default strategy runs on TF's default device (the first GPU, else the CPU), the
    device OneDeviceStrategy would pick, without wrapping every step and iterator:
    measured on digits/mlp, 0.047 s an epoch against 0.30 s (bench/training_speed.py).
    """
    import tensorflow as tf

    if runtime.devices or runtime.num_gpus:
        return tf.distribute.OneDeviceStrategy(device)
    return tf.distribute.get_strategy()


def steps_per_execution(requested: int, kind: str) -> int:
    """Keras steps_per_execution: as asked, or for ``0`` (auto) 10, but 1 on TPU. Under
    MirroredStrategy and multi-worker, more than 1 needs ``keras_patches/steps_in_cond.py``
    (Keras 3.15 / TF 2.21 fail without it); on TPU it has not been tried."""
    if requested:
        return requested
    return 1 if kind == "tpu" else 10


def _tpu_strategy(resolver: Any, name: str) -> Any:
    """Connect to the TPU the resolver names, initialise it, build TPUStrategy."""
    import tensorflow as tf

    tf.config.experimental_connect_to_cluster(resolver)
    try:
        tf.tpu.experimental.initialize_tpu_system(resolver)
    # TF signals "no TPU here" with a bare AssertionError, other failures with OpError.
    except (AssertionError, tf.errors.OpError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"runtime.tpu {name!r} answered at {resolver.master()} but its TPU system "
            f"could not be initialised: {str(exc) or type(exc).__name__}"
        ) from None
    return tf.distribute.TPUStrategy(resolver)
