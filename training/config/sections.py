"""The sections of a run's configuration: dataset, validation, model, fit, runtime,
promotion, storage. Each field's declaration is its whole schema (``schema.setting``).

Just over 300 lines on purpose: every field of five sections, each with its words,
bounds and key; split, the form's and the docs' order (the declaration order) would be
spread over modules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from training.config.data import DatasetConfig, ValidationConfig
from training.config.schema import Section, setting
from training.config.sweep import SweepConfig
from training.errors import ConfigError
from training.layout import NAME_PATTERN, NAME_WORDS
from training.train.models import MODELS, REFERENCE, check_args, resolve

MAX_WORKERS = 64  # also bounds the Kubernetes Job's pod names
DEVICE_PATTERN = r"(/job:\w+(/replica:\d+)?(/task:\d+)?)?/?(device:)?(CPU|GPU|TPU|cpu|gpu|tpu):\d+"


@dataclass(frozen=True)
class ModelConfig(Section):
    SECTION = "model"

    name: str = setting(
        "mlp", "Model: a built-in one (" + ", ".join(MODELS) + "), an installed "
        "package's (entry point group training.models) or a package.module:function "
        "reference (training/train/models/).",
        key="model", pattern=r"^[a-z][a-z0-9_]*$|" + REFERENCE.pattern,
        says="a model that is built in or installed, or a package.module:function "
             "reference",
    )
    args: dict[str, Any] = setting(
        {}, "The model's own arguments, checked against its builder's keyword-only "
        "arguments before anything runs. The backbones (mobilenet_v3_small, "
        "efficientnet_b0, resnet50) take image_size (32-1024, default 96), dropout "
        "(0.2), flip (false), rotation and zoom (0.0), e.g. {\"image_size\": 64, "
        "\"flip\": true}.", key="model_args",
    )
    weights: str = setting(
        "", "Pretrained weights for the model's backbone: a path or s3:// URI of a "
        ".weights.h5 file saved from it (nothing is downloaded); empty: random.",
        key="model_weights", pattern=r"^$|^\S+\.weights\.h5$",
        says="empty, or a path or s3:// URI of a .weights.h5 file",
    )
    warm_start: bool = setting(
        False, "Start from the weights of this model name's production version (read "
        "from the store, verified) instead of fresh ones; refused, naming the "
        "difference, when its architecture differs (layers, weight shapes, input shape, "
        "classes); with nothing in production the run trains from fresh weights and "
        "says so. The learning-rate schedule and early stopping apply as usual.",
        key="warm_start",
    )
    freeze_epochs: int = setting(
        0, "Epochs the backbone stays frozen while the head trains; then its top "
        "unfreeze_layers layers train at fine_tune_lr_factor times the learning rate "
        "(0: no schedule, everything trains).", key="freeze_epochs", minimum=0,
        maximum=1000,
    )
    unfreeze_layers: int = setting(
        0, "Layers at the top of the backbone that train after freeze_epochs "
        "(BatchNormalization stays frozen); 0: all of them.", key="unfreeze_layers",
        minimum=0, maximum=10_000,
    )
    fine_tune_lr_factor: float = setting(
        0.1, "Learning-rate multiplier applied once when the backbone unfreezes.",
        key="fine_tune_lr_factor", exclusive_minimum=0.0, maximum=1.0,
    )

    def _check_section(self) -> None:
        """The model exists and takes these arguments (its builder is loaded: for an
        installed or referenced model, the user's module is imported here)."""
        check_args(self.name, resolve(self.name), self.args)
        if self.warm_start and self.weights:
            raise ConfigError(
                f"model.warm_start is true and model.weights names {self.weights!r}: the "
                "production model's weights would replace the backbone's pretrained ones "
                "whole; set model.weights empty to warm-start, or model.warm_start false "
                "to start from those weights")
        if self.unfreeze_layers and not self.freeze_epochs:
            raise ConfigError(
                f"model.unfreeze_layers is {self.unfreeze_layers} but model.freeze_epochs "
                "is 0: set freeze_epochs to the epochs the backbone stays frozen first, "
                "or unfreeze_layers to 0")


def monitor_rises(monitor: str) -> bool:
    """Whether a monitored metric gets better as it rises: accuracy up, loss down. The
    one rule for EarlyStopping's mode and a sweep's direction."""
    return monitor.endswith("accuracy")


@dataclass(frozen=True)
class FitConfig(Section):
    SECTION = "fit"

    epochs: int = setting(30, "Maximum number of epochs.", key="epochs", minimum=1, maximum=1000)
    batch_size: int = setting(
        64, "Batch size per replica; the global batch is this times the replicas in sync.",
        key="batch_size", minimum=1, maximum=65536,
    )
    learning_rate: float = setting(
        1e-3, "Adam learning rate before scaling.", key="learning_rate",
        exclusive_minimum=0.0, maximum=10.0,
    )
    lr_scaling: str = setting(
        "none", "How the learning rate scales with the replicas in sync.",
        key="lr_scaling", enum=["none", "linear", "sqrt"],
    )
    early_stopping_monitor: str = setting(
        "val_loss", "Metric watched by EarlyStopping, ReduceLROnPlateau and the best checkpoint.",
        key="monitor", enum=["val_loss", "val_accuracy", "loss", "accuracy"],
    )
    early_stopping_patience: int = setting(
        10, "Epochs without improvement before training stops.",
        key="early_stopping_patience", minimum=0, maximum=1000,
    )
    early_stopping_min_delta: float = setting(
        0.0, "Smallest change of the monitored metric that counts as an improvement.",
        key="early_stopping_min_delta", minimum=0.0, maximum=1.0,
    )
    restore_best_weights: bool = setting(
        True, "Restore the weights of the best epoch at the end of training.",
        key="restore_best_weights",
    )
    reduce_lr_factor: float = setting(
        0.5, "Factor by which ReduceLROnPlateau multiplies the learning rate.",
        key="reduce_lr_factor", exclusive_minimum=0.0, maximum=0.99,
    )
    reduce_lr_patience: int = setting(
        5, "Epochs without improvement before the learning rate is reduced.",
        key="reduce_lr_patience", minimum=0, maximum=1000,
    )
    min_lr: float = setting(
        1e-6, "Lower bound of the learning rate.", key="min_lr", minimum=0.0, maximum=1.0,
    )
    backup_interval_s: float = setting(
        30.0, "Seconds between two end-of-epoch backups for resuming (0: every epoch); "
        "a SIGTERM always writes one.", key="backup_interval_s", minimum=0.0,
        maximum=86_400.0,
    )
    steps_per_execution: int = setting(
        0, "Batches run per tf.function call (Keras steps_per_execution); 0 is auto: 10, "
        "1 on TPU (not tried there). Under MirroredStrategy and multi-worker, Keras 3.15 "
        "needs training/train/keras_patches/steps_in_cond.py for more than 1 (installed "
        "automatically).",
        key="steps_per_execution", minimum=0, maximum=10_000,
    )
    seed: int = setting(
        42, "Seed for weights, shuffling and the digits splits.", key="seed",
        minimum=0, maximum=2**31 - 1,
    )


@dataclass(frozen=True)
class RuntimeConfig(Section):
    SECTION = "runtime"

    backend: str = setting(
        "tensorflow", "Keras backend of the training process: tensorflow (a tf.distribute "
        "strategy) or jax (a keras.distribution; that process imports no TensorFlow). "
        "Staging, publishing and serving are TensorFlow's either way (docs/backends.md).",
        key="backend", enum=["tensorflow", "jax"],
    )
    strategy: str = setting(
        "auto",
        "Distribution; auto picks tpu, multi_worker, mirrored or one_device from what it "
        "finds (under jax: one device, data parallel over the selected devices, model "
        "parallel, several processes; mirrored and tpu are TensorFlow's names).",
        key="strategy", enum=["auto", "one_device", "mirrored", "multi_worker", "tpu"],
    )
    model_parallel: int = setting(
        1, "Devices each model is split over under backend jax: the device mesh is "
        "(data, model) with this many on the model axis, the variables laid out by the "
        "model's layout rules; 1: data parallel only.", key="model_parallel",
        minimum=1, maximum=64,
    )
    accelerator: str = setting(
        "cpu", "Hardware the training task asks for (used for queues and pod specs).",
        key="accelerator", enum=["cpu", "gpu", "tpu"],
    )
    devices: list[str] = setting(
        [], "Explicit devices for one_device/mirrored, e.g. /gpu:0 /gpu:1; empty for auto.",
        key="devices",
    )
    num_gpus: int = setting(
        0, "Use the first N visible GPUs (0: all of them).", key="num_gpus",
        minimum=0, maximum=64,
    )
    workers: int = setting(
        1, "Number of training worker processes (multi-worker when more than 1).",
        key="workers", minimum=1, maximum=MAX_WORKERS,
    )
    launcher: str = setting(
        "local", "Where training runs: a subprocess on this worker (local) or pods on "
        "Kubernetes.", key="launcher", enum=["local", "kubernetes"],
    )
    tpu: str = setting(
        "", "TPU name for TPUClusterResolver ('local' for a TPU VM); empty for none.",
        key="tpu",
    )
    collective_timeout_s: int = setting(
        1800, "Seconds a multi-worker collective (all-reduce) may wait before it fails the "
        "run instead of hanging (0: no limit).", key="collective_timeout_s",
        minimum=0, maximum=86_400,
    )
    all_reduce: str = setting(
        "auto", "Multi-worker all-reduce implementation (tf.distribute "
        "CommunicationImplementation; other strategies ignore it): auto lets TensorFlow "
        "choose (ring on CPU), ring is its gRPC ring, nccl needs a GPU on every worker "
        "(refused when the strategy is built on a worker that has none).",
        key="all_reduce",
        enum=["auto", "ring", "nccl"],
    )
    gradient_pack_mb: int = setting(
        0, "Multi-worker gradient packing (CommunicationOptions bytes_per_pack, in MiB; "
        "other strategies ignore it): "
        "each step's gradients are all-reduced in packs of at least this size, several "
        "smaller collectives instead of one (pays for large models: 4 for ResNet50's "
        "94 MB); 0 is TensorFlow's default: all of them concatenated into one.",
        key="gradient_pack_mb", minimum=0, maximum=4096,
    )
    jit_compile: bool = setting(
        False, "Compile the train step with XLA (TensorFlow; under jax XLA compiles every "
        "step whatever this says, so true is refused there).", key="jit_compile")
    mixed_precision: str = setting(
        "auto", "Keras dtype policy; auto is mixed_bfloat16 on TPU and float32 elsewhere "
        "(mixed_float16 suits recent NVIDIA GPUs).", key="mixed_precision",
        enum=["auto", "float32", "mixed_float16", "mixed_bfloat16"],
    )

    def _check_section(self) -> None:
        for device in self.devices:
            if not re.fullmatch(DEVICE_PATTERN, device):
                raise ConfigError(
                    f"runtime.devices must hold device names like /gpu:0 or /cpu:0, "
                    f"got {device!r}"
                )


@dataclass(frozen=True)
class PromotionConfig(Section):
    SECTION = "promotion"

    min_accuracy: float = setting(
        0.9, "Test accuracy the new model needs before it can go to production.",
        key="min_accuracy", minimum=0.0, maximum=1.0,
    )
    min_improvement: float = setting(
        0.0, "Test accuracy the new model must gain over production; negative allows "
        "that much regression.", key="min_improvement", minimum=-1.0, maximum=1.0,
    )
    force_promote: bool = setting(
        False, "Promote even when the policy says no (recorded as forced).",
        key="force_promote",
    )
    holdout_uri: str = setting(
        "", "A pinned holdout both models are also scored on, every night the same images "
        "(the report shows both scores; the decision stays on the test split): a "
        "directory or s3://bucket/prefix of <label>/<image file>; empty: none.",
        key="holdout_uri",
        pattern=r"^$|^(s3://[a-z0-9.-]{3,63}(/.*)?|file://.+|[^:]+)$",
        says="empty, or s3://bucket/prefix, file:///path or a local path",
    )
    require_approval: bool = setting(
        False, "Wait for a person's approval (the Airflow UI's Required actions) before a "
        "model that wins goes to production; a model that loses never asks. Airflow "
        "runs only: the CLI has nobody to ask.", key="require_approval",
    )
    approval_timeout_minutes: int = setting(
        1440, "How long a winning model waits for approval; no answer by then: not "
        "promoted, recorded as timed out, and an alert.", key="approval_timeout_minutes",
        minimum=1, maximum=10080,
    )


@dataclass(frozen=True)
class StorageConfig(Section):
    SECTION = "storage"

    output_dir: str = setting(
        "runs", "Local directory holding one sub-directory per run.",
        key="output_dir", deployment=True,
    )
    run_id: str = setting(
        "", "Run identifier; empty derives it from the configuration, so a retry "
        "reuses the same directory.", key="run_id", deployment=True,
        pattern=r"^$|" + NAME_PATTERN, says=f"empty, or a run id of {NAME_WORDS}",
    )
    store_uri: str = setting(
        "var/store", "Object store for published models: s3://bucket/prefix, "
        "file:///path or a local path.", key="store_uri", deployment=True,
        pattern=r"^(s3://[a-z0-9.-]{3,63}(/.*)?|file://.+|[^:]+)$",
        says="s3://bucket/prefix, file:///path or a local path",
    )
    max_version_mb: int = setting(
        10_240, "Largest version the registry accepts, in MiB; publishing a larger one "
        "is refused with the sizes.", key="max_version_mb", deployment=True,
        minimum=1, maximum=10_485_760,
    )
    model_name: str = setting(
        "", "Registry name of the model; empty uses '<dataset>-<model>'.",
        key="model_name", pattern=r"^$|" + NAME_PATTERN,
        says=f"empty, or a registry name of {NAME_WORDS}",
    )


SECTIONS: dict[str, type[Section]] = {
    "dataset": DatasetConfig,
    "validation": ValidationConfig,
    "model": ModelConfig,
    "fit": FitConfig,
    "runtime": RuntimeConfig,
    "promotion": PromotionConfig,
    "storage": StorageConfig,
    "sweep": SweepConfig,  # training/config/sweep.py: off unless sweep.trials is set
}


