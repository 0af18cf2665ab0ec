"""Accelerators on Kubernetes: what a pod asks for and which nodes it may run on.

GPU pods limit ``nvidia.com/gpu`` (``runtime.num_gpus``, else the GPUs named in
``runtime.devices``, else 1), select ``options.gpu_node_selector`` and tolerate
``nvidia.com/gpu``. TPU pods request and limit ``google.com/tpu`` (the chips of one TPU
VM) on GKE TPU nodes (``cloud.google.com/gke-tpu-accelerator`` / ``-topology``), one pod
per TPU VM of the slice. CPU pods ask for no accelerator.
"""

from __future__ import annotations

import math
from typing import Any

from training.config import RunConfig
from training.errors import ConfigError
from training.launch.kubernetes.options import KubernetesOptions

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def gpus_per_worker(cfg: RunConfig) -> int:
    """GPUs one pod asks for: ``runtime.num_gpus``, else the GPUs in ``devices``, else 1."""
    runtime = cfg.runtime
    if runtime.num_gpus:
        return runtime.num_gpus
    named = {d.lower().rsplit(":", 1)[-1] for d in runtime.devices if "gpu" in d.lower()}
    return len(named) or 1


def check_accelerator(cfg: RunConfig, options: KubernetesOptions) -> None:
    """The run's accelerator agrees with its strategy and devices, and a TPU run with the
    slice: ``runtime.workers`` is the slice's hosts."""
    runtime = cfg.runtime
    if runtime.strategy == "tpu" and runtime.accelerator != "tpu":
        raise ConfigError(
            f"runtime.accelerator must be 'tpu' when runtime.strategy is 'tpu', "
            f"got {runtime.accelerator!r}"
        )
    if runtime.accelerator != "gpu" and (
        runtime.num_gpus or any("gpu" in d.lower() for d in runtime.devices)
    ):
        raise ConfigError(
            f"runtime.accelerator must be 'gpu' when runtime.num_gpus or runtime.devices "
            f"name GPUs, got {runtime.accelerator!r}"
        )
    if runtime.all_reduce == "nccl" and runtime.workers > 1 and runtime.accelerator != "gpu":
        raise ConfigError(  # the pods would get no GPU; every worker would refuse to start
            f"runtime.accelerator must be 'gpu' when runtime.all_reduce is 'nccl' (NCCL "
            f"needs a GPU on every worker), got {runtime.accelerator!r}; or set "
            f"runtime.all_reduce to 'auto' or 'ring'"
        )
    if runtime.accelerator == "tpu":
        chips = math.prod(int(n) for n in options.tpu_topology.split("x"))
        if chips != runtime.workers * options.tpu_chips_per_worker:
            raise ConfigError(
                f"runtime.workers must be the TPU slice's hosts: topology "
                f"{options.tpu_topology!r} has {chips} chips, which is "
                f"{chips / options.tpu_chips_per_worker:g} workers of "
                f"{options.tpu_chips_per_worker} chips (tpu_chips_per_worker), "
                f"got {runtime.workers}"
            )


def scheduling(cfg: RunConfig, options: KubernetesOptions) -> dict[str, Any]:
    """Resources, node selector and tolerations of one pod, for the run's accelerator."""
    requests = {"cpu": options.cpu, "memory": options.memory}
    limits = {"memory": options.memory}
    selector = dict(options.node_selector)
    tolerations = [dict(t) for t in options.tolerations]
    accelerator = cfg.runtime.accelerator
    if accelerator == "gpu":
        limits["nvidia.com/gpu"] = str(gpus_per_worker(cfg))
        selector.update(options.gpu_node_selector)
        tolerations.insert(0, dict(GPU_TOLERATION))
    elif accelerator == "tpu":
        chips = str(options.tpu_chips_per_worker)
        requests["google.com/tpu"] = limits["google.com/tpu"] = chips
        selector["cloud.google.com/gke-tpu-accelerator"] = options.tpu_accelerator
        selector["cloud.google.com/gke-tpu-topology"] = options.tpu_topology
        tolerations.insert(0, dict(TPU_TOLERATION))
    return {
        "resources": {"requests": requests, "limits": limits},
        "node_selector": dict(sorted(selector.items())),
        "tolerations": tolerations,
    }
