"""The settings that cannot take effect under ``runtime.backend``: refused, naming both.

Under ``jax`` the distribution is a ``keras.distribution`` (``training.train.
jax_distribution``), so ``tf.distribute``'s own settings would be silently ignored there;
under ``tensorflow`` nothing splits a model over devices. ``check_across`` calls
``check_backend`` whenever a config is built.
"""

from __future__ import annotations

from typing import Any

from training.errors import ConfigError

# TensorFlow's settings and their defaults: under jax each must keep its default.
TENSORFLOW_ONLY = {
    "all_reduce": ("auto", "the all-reduce of tf.distribute's MultiWorkerMirroredStrategy"),
    "gradient_pack_mb": (0, "tf.distribute's gradient packing"),
    "tpu": ("", "TensorFlow's TPUClusterResolver; JAX finds a TPU host's devices itself"),
    "jit_compile": (False, "TensorFlow's XLA switch; JAX compiles every step with XLA"),
    "collective_timeout_s": (1800, "tf.distribute's collective timeout"),
}


def check_backend(runtime: Any) -> None:
    """Settings that cannot take effect under ``runtime.backend``: refused, naming both."""
    if runtime.backend == "tensorflow":
        if runtime.model_parallel > 1:
            raise ConfigError(
                f"runtime.model_parallel is {runtime.model_parallel}, but runtime.backend "
                "is 'tensorflow': splitting a model over devices needs Keras's "
                "keras.distribution, which runs on backend 'jax'; set runtime.backend to "
                "'jax' or runtime.model_parallel to 1")
        return
    for name, (default, what) in TENSORFLOW_ONLY.items():
        value = getattr(runtime, name)
        if value != default:
            raise ConfigError(
                f"runtime.{name} is {value!r}, but runtime.backend is 'jax': it sets {what} "
                f"and would be ignored; leave runtime.{name} at {default!r} or set "
                "runtime.backend to 'tensorflow'")
    if runtime.strategy in ("mirrored", "tpu"):
        raise ConfigError(
            f"runtime.strategy is {runtime.strategy!r}, a tf.distribute strategy, but "
            "runtime.backend is 'jax': use 'auto' (one device, data parallel over "
            "runtime.devices, model parallel, several workers, a TPU host's devices), "
            "'one_device' or 'multi_worker'")
    if runtime.workers > 1 and (runtime.devices or runtime.num_gpus):
        asked = "runtime.devices" if runtime.devices else "runtime.num_gpus"
        raise ConfigError(
            f"{asked} selects devices, but runtime.workers is {runtime.workers} under "
            "runtime.backend 'jax': every device of every worker joins the mesh; leave "
            f"{asked} empty, or train on one worker")
    if runtime.model_parallel > 1 and runtime.strategy == "one_device":
        raise ConfigError(
            f"runtime.model_parallel is {runtime.model_parallel}, but runtime.strategy is "
            "'one_device': a model split over devices needs them; set runtime.strategy "
            "to 'auto' or runtime.model_parallel to 1")
