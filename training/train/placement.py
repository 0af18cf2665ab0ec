"""What both Keras backends' distributions share: the devices a run asks for, the
global batch and learning rate, and ``Resolved``, the decision as ``run.json`` records it.

``strategy`` (TensorFlow's ``tf.distribute``) and ``jax_distribution``
(``keras.distribution``) each build their own, from these.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Any

from training.config import RuntimeConfig
from training.errors import ConfigError

_LOCAL_DEVICE = re.compile(r"/?(?:device:)?(cpu|gpu|tpu):(\d+)", re.IGNORECASE)


def check_devices(asked: list[str], available: list[str]) -> None:
    """ConfigError unless every device asked for exists here, once each (a device that
    does not exist would leave MirroredStrategy waiting for ever at the first step)."""
    have = {}
    for name in available:  # TF's logical names: /device:CPU:0, /job:localhost/.../GPU:0
        found = _LOCAL_DEVICE.search(name.rsplit("/", 1)[-1] if "/job:" in name else name)
        if found:
            have[(found[1].upper(), int(found[2]))] = name
    seen = set()
    for device in asked:
        local = _LOCAL_DEVICE.fullmatch(device)
        if local is None:  # /job:... names a device of a cluster: TF checks it
            continue
        key = (local[1].upper(), int(local[2]))
        if key in seen:
            raise ConfigError(f"runtime.devices names {device} twice, got {asked}")
        seen.add(key)
        if key not in have:
            shown_have = ", ".join(f"/{t.lower()}:{i}" for t, i in sorted(have)) or "none"
            raise ConfigError(f"runtime.devices asks for {device}, which this machine does "
                              f"not have; it has: {shown_have}")


def select_devices(runtime: RuntimeConfig, gpu_names: list[str]) -> list[str]:
    """The devices to train on: the explicit list, else the first N GPUs, else the CPU."""
    if runtime.devices:
        return list(runtime.devices)
    if runtime.num_gpus:
        if runtime.num_gpus > len(gpu_names):
            raise ConfigError(
                f"runtime.num_gpus asks for {runtime.num_gpus} GPUs but {len(gpu_names)} "
                f"are visible ({', '.join(gpu_names) or 'none'})"
            )
        return gpu_names[: runtime.num_gpus]
    return gpu_names or ["/cpu:0"]


def scaled_learning_rate(base: float, rule: str, replicas: int) -> float:
    if rule == "none":
        return base
    if rule == "linear":
        return base * replicas
    if rule == "sqrt":
        return base * math.sqrt(replicas)
    raise ConfigError(f"fit.lr_scaling must be one of none, linear, sqrt, got {rule!r}")


@dataclass(frozen=True)
class Resolved:
    """The strategy (TensorFlow) or distribution (JAX; None for the default device) and
    the effective values it implies; ``to_dict`` is recorded. ``details``: what only one
    backend has (JAX's mesh, processes and platform)."""

    strategy: Any
    kind: str
    devices: list[str]
    replicas: int
    global_batch_size: int
    learning_rate: float
    is_chief: bool
    backend: str = "tensorflow"
    details: dict[str, Any] = field(default_factory=dict)

    def scope(self) -> Any:
        """Where the model and optimizer are built: the strategy's or distribution's."""
        return self.strategy.scope() if self.strategy is not None else (
            contextlib.nullcontext())

    @property
    def on_tpu(self) -> bool:
        return self.kind == "tpu" or self.details.get("platform") == "tpu"

    @property
    def several_processes(self) -> bool:
        """Several workers train together: one cannot save (a SIGTERM backup) for all."""
        return self.kind == "multi_worker"

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "kind": self.kind,
            "devices": self.devices,
            "replicas_in_sync": self.replicas,
            "global_batch_size": self.global_batch_size,
            "learning_rate": self.learning_rate,
            "is_chief": self.is_chief,
            **self.details,
        }


def not_a_worker(workers: int, tf_config: str | None) -> ConfigError:
    """The refusal of ``runtime.workers`` > 1 in a process that no launcher started."""
    return ConfigError(
        f"runtime.workers is {workers} but this process is not a worker of a "
        f"cluster (TF_CONFIG is {'unset' if not tf_config else 'a single worker'}): it "
        "would train alone; start the workers with `python -m training train` (which "
        "launches them here) or in the Kubernetes Job's pods, which set TF_CONFIG")


BF16_COMPUTE_CAPABILITY = (8, 0)  # NVIDIA's bf16 matrix units: Ampere (8.0) and later


def precision_policy(requested: str, accelerator: dict[str, Any]) -> tuple[str, str]:
    """The Keras dtype policy and why (logged): as asked, or for ``auto``
    ``mixed_bfloat16`` on a TPU or on a GPU with bf16 matrix units (compute capability
    8.0 or more), ``float32`` elsewhere (the CPU, an older GPU)."""
    if requested != "auto":
        return requested, f"runtime.mixed_precision is {requested!r}"
    where = accelerator.get("platform")
    name = accelerator.get("name") or where
    if where == "tpu":
        return "mixed_bfloat16", "auto: a TPU computes in bfloat16"
    if where == "gpu":
        capability = accelerator.get("compute_capability")
        try:
            found = tuple(int(p) for p in str(capability).split(".")[:2])
        except ValueError:
            found = None
        if found and found >= BF16_COMPUTE_CAPABILITY:
            return "mixed_bfloat16", (f"auto: GPU {name} has bf16 matrix units (compute "
                                      f"capability {capability} >= 8.0)")
        return "float32", (f"auto: GPU {name} has no bf16 matrix units (compute capability "
                           f"{capability or 'unknown'} < 8.0)")
    return "float32", f"auto: {where or 'this device'} has no bf16 matrix units"
