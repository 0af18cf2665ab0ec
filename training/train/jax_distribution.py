"""The distribution of a JAX training process: ``keras.distribution``, decided as the
TensorFlow strategy is (``strategy.resolve`` calls ``resolve`` for ``runtime.backend``
``jax``) and recorded the same way (``placement.Resolved``).

``choose_kind`` is the decision (pure, unit-tested):

1. ``multi_worker`` when ``TF_CONFIG`` names more than one worker: the processes are
   joined through ``keras.distribution.initialize`` (``jax.distributed``), worker 0's
   address being the coordinator (``cluster.coordinator``); every device of every
   process is in the mesh, and each process feeds its own slice of each global batch;
2. ``model_parallel`` when ``runtime.model_parallel`` > 1: a (data, model) mesh, the
   variables laid out by the model's layout rules (``models.layout_rules``);
3. ``data_parallel`` over the selected devices when there are several;
4. ``one_device`` otherwise.

Devices are JAX's: ``runtime.devices`` names them as TensorFlow does (``/gpu:0``,
``/cpu:1``, ``/tpu:0``) and ``runtime.num_gpus`` takes the first N GPUs; without
either, every local device of JAX's default platform (the GPUs, a TPU host's chips,
else the CPU devices: one, or ``JAX_NUM_CPU_DEVICES``). No TensorFlow resolver is
involved: on a TPU host JAX finds the chips itself.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from training.config import RunConfig
from training.errors import ConfigError
from training.train import cluster, models
from training.train.placement import (
    Resolved,
    check_devices,
    not_a_worker,
    scaled_learning_rate,
    select_devices,
)

log = logging.getLogger(__name__)

KINDS = ("one_device", "data_parallel", "model_parallel", "multi_worker")
DATA_AXIS, MODEL_AXIS = "data", "model"


def choose_kind(requested: str, *, processes: int, devices: int, model_parallel: int) -> str:
    """The distribution kind for a request, given what the machine offers."""
    if processes > 1:
        return "multi_worker"
    if requested == "one_device":
        return "one_device"
    if model_parallel > 1:
        return "model_parallel"
    return "data_parallel" if devices > 1 else "one_device"


def name_of(device: Any) -> str:
    """A JAX device as ``runtime.devices`` names it: ``/gpu:0``."""
    return f"/{device.platform}:{device.id}"


def _keras_name(name: str) -> str:
    """``/gpu:0`` (or ``/device:GPU:0``) as Keras's distribution names it: ``gpu:0``."""
    kind, index = re.search(r"(cpu|gpu|tpu):(\d+)$", name, re.IGNORECASE).groups()
    return f"{kind.lower()}:{index}"


def accelerator(count: int) -> dict[str, Any]:
    """What trains: JAX's platform, its first device's kind, how many devices, a GPU's
    compute capability (``placement.precision_policy`` reads it)."""
    import jax

    device = jax.devices()[0]
    return {"platform": device.platform, "name": device.device_kind, "count": count,
            "compute_capability": getattr(device, "compute_capability", None)}


def mesh_shape(devices: int, model_parallel: int) -> tuple[int, int]:
    """(data, model) for ``devices`` split ``model_parallel`` ways; ConfigError when they
    do not divide."""
    if model_parallel > devices or devices % model_parallel:
        raise ConfigError(
            f"runtime.model_parallel is {model_parallel}, but the mesh has {devices} "
            f"device{'s' if devices != 1 else ''}: the (data, model) mesh needs a device "
            f"count that model_parallel divides; use one of "
            f"{[m for m in range(1, devices + 1) if devices % m == 0]}")
    return devices // model_parallel, model_parallel


def resolve(cfg: RunConfig) -> Resolved:
    """Build the distribution the config asks for; log and return the effective values."""
    import jax
    import keras

    runtime = cfg.runtime
    tf_config = cluster.current()
    processes = cluster.workers(tf_config)
    if runtime.workers > 1 and processes <= 1:
        raise not_a_worker(runtime.workers, tf_config)
    if processes > 1:
        address, count, index = cluster.coordinator(tf_config)
        keras.distribution.initialize(job_addresses=address, num_processes=count,
                                      process_id=index)
        devices = [name_of(d) for d in jax.devices()]  # every process's, in one mesh
    else:
        local = jax.local_devices()
        if runtime.devices:
            check_devices(list(runtime.devices), [name_of(d) for d in local])
        gpus = [name_of(d) for d in local if d.platform == "gpu"]
        devices = (select_devices(runtime, gpus) if runtime.devices or runtime.num_gpus
                   else [name_of(d) for d in local])
    kind = choose_kind(runtime.strategy, processes=processes, devices=len(devices),
                       model_parallel=runtime.model_parallel)
    if kind == "one_device":
        devices = devices[:1]
    data, model = mesh_shape(len(devices), runtime.model_parallel)
    distribution = _distribution(cfg, kind, devices, data, model)
    # The process's (fit lays out each batch by it); None: JAX's default device.
    keras.distribution.set_distribution(distribution)
    resolved = Resolved(
        strategy=distribution,
        kind=kind,
        devices=devices,
        replicas=data,
        global_batch_size=cfg.fit.batch_size * data,
        learning_rate=scaled_learning_rate(cfg.fit.learning_rate, cfg.fit.lr_scaling, data),
        is_chief=cluster.is_chief(tf_config),
        backend="jax",
        details={"mesh": {DATA_AXIS: data, MODEL_AXIS: model},
                 "processes": max(processes, 1),
                 "platform": jax.default_backend(),
                 "accelerator": accelerator(len(devices))},
    )
    log.info(
        "distribution %s (jax, %s) on %s: mesh data=%d x model=%d, global batch %d (%d "
        "per replica), learning rate %g (%s scaling of %g)", kind, jax.default_backend(),
        devices, data, model, resolved.global_batch_size, cfg.fit.batch_size,
        resolved.learning_rate, cfg.fit.lr_scaling, cfg.fit.learning_rate)
    return resolved


def _distribution(cfg: RunConfig, kind: str, devices: list[str], data: int,
                  model: int) -> Any:
    """The ``keras.distribution`` for ``kind``; None for the default device alone."""
    import numpy as np
    from keras import distribution

    if kind == "one_device" and not (cfg.runtime.devices or cfg.runtime.num_gpus):
        return None  # JAX's default device: no mesh to place anything on
    names = np.array([_keras_name(d) for d in devices])
    if model == 1:
        # Each process reads its own slice of every batch (numpy_reader.SplitBatches):
        # Keras's auto-sharding is for tf.data.
        return distribution.DataParallel(devices=list(names), auto_shard_dataset=False)
    mesh = distribution.DeviceMesh(shape=(data, model), axis_names=(DATA_AXIS, MODEL_AXIS),
                                   devices=names.reshape(data, model))
    layout = distribution.LayoutMap(mesh)
    for pattern, axes in models.layout_rules(cfg.model.name).items():
        layout[pattern] = axes
    return distribution.ModelParallel(layout_map=layout, batch_dim_name=DATA_AXIS,
                                      auto_shard_dataset=False)


def check_layout(cfg: RunConfig, resolved: Resolved, model: Any) -> None:
    """After the model is built under the distribution: every layout rule names a
    variable of it (else ConfigError naming the setting), and the layouts are logged."""
    if resolved.kind not in ("model_parallel", "multi_worker") or (
            cfg.runtime.model_parallel == 1):
        return
    paths = [v.path for v in model.variables]
    for pattern in models.layout_rules(cfg.model.name):
        if not any(re.search(pattern, path) for path in paths):
            raise ConfigError(
                f"runtime.model_parallel is {cfg.runtime.model_parallel}, but layout rule "
                f"{pattern!r} of model {cfg.model.name!r} names no variable of it; its "
                f"variables: {', '.join(paths[:12])}{' ...' if len(paths) > 12 else ''}")
    for variable in model.trainable_variables:
        spec = getattr(variable.value.sharding, "spec", None)
        if spec is not None and any(axis is not None for axis in spec):
            log.info("variable %s %s split over the mesh as %s", variable.path,
                     tuple(variable.shape), tuple(spec))
