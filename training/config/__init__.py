"""One typed run configuration: dataset, model, fitting, runtime and storage.

The schema lives in the dataclass fields below: each field carries its type, default,
bounds or allowed values, a description and a flat ``key``. That one schema drives

* the command-line flags (``--epochs``, ``--batch-size``, ... see ``cli.py``),
* JSON config files (nested by section, unknown keys rejected),
* the Airflow trigger form (``json_schema()`` / ``flat_fields()``; one Param a field).

Validation happens once, when a config is built, and every error names the field, the
received value and what is allowed. Configs are frozen after validation; overrides make
a new validated config (``RunConfig.from_dict`` / ``with_overrides``).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.errors import ConfigError, shown
from training.layout import NAME_PATTERN, NAME_WORDS
from training.train.models import MODELS

DEVICE_PATTERN = r"(/job:\w+(/replica:\d+)?(/task:\d+)?)?/?(device:)?(CPU|GPU|TPU|cpu|gpu|tpu):\d+"


def _field(default: Any, description: str, *, key: str | None = None,
           deployment: bool = False, **rules: Any) -> Any:
    """A config field with its schema in the metadata.

    rules: minimum, maximum (inclusive), exclusive_minimum, enum, nullable, and
    pattern with ``says``: the regular expression and the words that tell a person
    what it allows (errors and the trigger form show the words, never the pattern).
    deployment: set by whoever deploys the pipeline (paths, the store), never by the
    Airflow trigger form.
    """
    meta = {"description": description, "key": key, "deployment": deployment, **rules}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def _describe_allowed(meta: Mapping[str, Any], kind: type) -> str:
    if "enum" in meta:
        return "one of " + ", ".join(repr(v) for v in meta["enum"])
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if meta.get("exclusive_minimum") is not None:
        lo_txt = f"greater than {meta['exclusive_minimum']}"
        return lo_txt if hi is None else f"{lo_txt} and at most {hi}"
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    if lo is not None:
        return f"at least {lo}"
    if "says" in meta:
        return meta["says"]
    return f"a {kind.__name__}"


class _Section:
    """Validation shared by every section: types, bounds, enums, patterns."""

    SECTION: str = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            object.__setattr__(self, f.name, _check(self.SECTION, f, value))
        self._check_section()

    def _check_section(self) -> None:
        """Cross-field rules of one section; override where needed."""


def _field_type(f: dataclasses.Field) -> tuple[type, bool]:
    """(base type, is list) of a field, from its annotation string."""
    ann = str(f.type).replace(" ", "")
    is_list = ann.startswith("list[")
    base = ann.removeprefix("list[").removesuffix("]").replace("|None", "")
    return {"int": int, "float": float, "bool": bool, "str": str}[base], is_list


def _check(section: str, f: dataclasses.Field, value: Any) -> Any:
    meta = f.metadata
    name = f"{section}.{f.name}"
    kind, is_list = _field_type(f)
    if value is None:
        if meta.get("nullable"):
            return None
        raise ConfigError(f"{name} must be {_describe_allowed(meta, kind)}, got None")
    if is_list:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name} must be a list of strings, got {shown(value)}")
        return list(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(
            f"{name} must be {_describe_allowed(meta, kind)}, got {shown(value)} "
            f"({type(value).__name__})"
        )
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {shown(value)}")
    bad = (
        ("enum" in meta and value not in meta["enum"])
        or (meta.get("minimum") is not None and value < meta["minimum"])
        or (meta.get("maximum") is not None and value > meta["maximum"])
        or (meta.get("exclusive_minimum") is not None and value <= meta["exclusive_minimum"])
        or ("pattern" in meta and not re.fullmatch(meta["pattern"], value))
    )
    if bad:
        raise ConfigError(f"{name} must be {_describe_allowed(meta, kind)}, got {shown(value)}")
    return value


@dataclass(frozen=True)
class DatasetConfig(_Section):
    SECTION = "dataset"

    name: str = _field(
        "digits",
        "Dataset to train on: 'digits' (built in, offline) or a tensorflow-datasets "
        "image-classification dataset such as mnist, fashion_mnist or cifar10.",
        key="dataset",
        pattern=r"^[a-z][a-z0-9_]*(/[a-z0-9_]+)?$",
        says="a dataset name: lower-case letters, digits and '_', starting with a letter, "
             "with an optional '/config' (e.g. mnist, cifar10)",
    )
    version: str | None = _field(
        None,
        "Dataset version (e.g. 3.0.1); empty for the builder's default version.",
        key="dataset_version",
        nullable=True,
        pattern=r"^\d+\.\d+\.\d+$",
        says="a version of three numbers, like 3.0.1",
    )
    staging_dir: str = _field(
        "var/datasets", "Directory where datasets are prepared and cached.",
        key="staging_dir", deployment=True,
    )
    validation_fraction: float = _field(
        0.1,
        "Share of the training split held out for validation when the dataset has no "
        "validation split of its own.",
        key="validation_fraction",
        exclusive_minimum=0.0,
        maximum=0.5,
    )
    shuffle_buffer: int = _field(
        10_000, "Examples in the tf.data shuffle buffer.", key="shuffle_buffer",
        minimum=1, maximum=1_000_000,
    )


@dataclass(frozen=True)
class ModelConfig(_Section):
    SECTION = "model"

    name: str = _field(
        "mlp", "Model architecture from the model registry (training/train/models.py).",
        key="model", enum=list(MODELS),
    )


@dataclass(frozen=True)
class FitConfig(_Section):
    SECTION = "fit"

    epochs: int = _field(30, "Maximum number of epochs.", key="epochs", minimum=1, maximum=1000)
    batch_size: int = _field(
        64, "Batch size per replica; the global batch is this times the replicas in sync.",
        key="batch_size", minimum=1, maximum=65536,
    )
    learning_rate: float = _field(
        1e-3, "Adam learning rate before scaling.", key="learning_rate",
        exclusive_minimum=0.0, maximum=10.0,
    )
    lr_scaling: str = _field(
        "none", "How the learning rate scales with the replicas in sync.",
        key="lr_scaling", enum=["none", "linear", "sqrt"],
    )
    early_stopping_monitor: str = _field(
        "val_loss", "Metric watched by EarlyStopping, ReduceLROnPlateau and the best checkpoint.",
        key="monitor", enum=["val_loss", "val_accuracy", "loss", "accuracy"],
    )
    early_stopping_patience: int = _field(
        10, "Epochs without improvement before training stops.",
        key="early_stopping_patience", minimum=0, maximum=1000,
    )
    early_stopping_min_delta: float = _field(
        0.0, "Smallest change of the monitored metric that counts as an improvement.",
        key="early_stopping_min_delta", minimum=0.0, maximum=1.0,
    )
    restore_best_weights: bool = _field(
        True, "Restore the weights of the best epoch at the end of training.",
        key="restore_best_weights",
    )
    reduce_lr_factor: float = _field(
        0.5, "Factor by which ReduceLROnPlateau multiplies the learning rate.",
        key="reduce_lr_factor", exclusive_minimum=0.0, maximum=0.99,
    )
    reduce_lr_patience: int = _field(
        5, "Epochs without improvement before the learning rate is reduced.",
        key="reduce_lr_patience", minimum=0, maximum=1000,
    )
    min_lr: float = _field(
        1e-6, "Lower bound of the learning rate.", key="min_lr", minimum=0.0, maximum=1.0,
    )
    backup_interval_s: float = _field(
        30.0, "Seconds between two end-of-epoch backups for resuming (0: every epoch); "
        "a SIGTERM always writes one.", key="backup_interval_s", minimum=0.0,
        maximum=86_400.0,
    )
    steps_per_execution: int = _field(
        0, "Batches run per tf.function call (Keras steps_per_execution); 0 is auto: 10 "
        "on one device (1.7x the throughput of 1 on digits), 1 under MirroredStrategy, "
        "multi-worker and TPU (10 fails under MirroredStrategy in Keras 3.15).",
        key="steps_per_execution", minimum=0, maximum=10_000,
    )
    seed: int = _field(
        42, "Seed for weights, shuffling and the digits splits.", key="seed",
        minimum=0, maximum=2**31 - 1,
    )


@dataclass(frozen=True)
class RuntimeConfig(_Section):
    SECTION = "runtime"

    strategy: str = _field(
        "auto",
        "tf.distribute strategy; auto picks tpu, multi_worker, mirrored or one_device "
        "from what it finds.",
        key="strategy", enum=["auto", "one_device", "mirrored", "multi_worker", "tpu"],
    )
    accelerator: str = _field(
        "cpu", "Hardware the training task asks for (used for queues and pod specs).",
        key="accelerator", enum=["cpu", "gpu", "tpu"],
    )
    devices: list[str] = _field(
        [], "Explicit devices for one_device/mirrored, e.g. /gpu:0 /gpu:1; empty for auto.",
        key="devices",
    )
    num_gpus: int = _field(
        0, "Use the first N visible GPUs (0: all of them).", key="num_gpus",
        minimum=0, maximum=64,
    )
    workers: int = _field(
        1, "Number of training worker processes (multi-worker when more than 1).",
        key="workers", minimum=1, maximum=64,
    )
    launcher: str = _field(
        "local", "Where training runs: a subprocess on this worker (local) or pods on "
        "Kubernetes.", key="launcher", enum=["local", "kubernetes"],
    )
    tpu: str = _field(
        "", "TPU name for TPUClusterResolver ('local' for a TPU VM); empty for none.",
        key="tpu",
    )
    collective_timeout_s: int = _field(
        1800, "Seconds a multi-worker collective (all-reduce) may wait before it fails the "
        "run instead of hanging (0: no limit).", key="collective_timeout_s",
        minimum=0, maximum=86_400,
    )
    jit_compile: bool = _field(False, "Compile the train step with XLA.", key="jit_compile")
    mixed_precision: str = _field(
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
class PromotionConfig(_Section):
    SECTION = "promotion"

    min_accuracy: float = _field(
        0.9, "Test accuracy the new model needs before it can go to production.",
        key="min_accuracy", minimum=0.0, maximum=1.0,
    )
    min_improvement: float = _field(
        0.0, "Test accuracy the new model must gain over production; negative allows "
        "that much regression.", key="min_improvement", minimum=-1.0, maximum=1.0,
    )
    force_promote: bool = _field(
        False, "Promote even when the policy says no (recorded as forced).",
        key="force_promote",
    )


@dataclass(frozen=True)
class StorageConfig(_Section):
    SECTION = "storage"

    output_dir: str = _field(
        "runs", "Local directory holding one sub-directory per run.",
        key="output_dir", deployment=True,
    )
    run_id: str = _field(
        "", "Run identifier; empty derives it from the configuration, so a retry "
        "reuses the same directory.", key="run_id", deployment=True,
        pattern=r"^$|" + NAME_PATTERN, says=f"empty, or a run id of {NAME_WORDS}",
    )
    store_uri: str = _field(
        "var/store", "Object store for published models: s3://bucket/prefix, "
        "file:///path or a local path.", key="store_uri", deployment=True,
        pattern=r"^(s3://[a-z0-9.-]{3,63}(/.*)?|file://.+|[^:]+)$",
        says="s3://bucket/prefix, file:///path or a local path",
    )
    max_version_mb: int = _field(
        10_240, "Largest version the registry accepts, in MiB; publishing a larger one "
        "is refused with the sizes.", key="max_version_mb", deployment=True,
        minimum=1, maximum=10_485_760,
    )
    model_name: str = _field(
        "", "Registry name of the model; empty uses '<dataset>-<model>'.",
        key="model_name", pattern=r"^$|" + NAME_PATTERN,
        says=f"empty, or a registry name of {NAME_WORDS}",
    )


SECTIONS: dict[str, type[_Section]] = {
    "dataset": DatasetConfig,
    "model": ModelConfig,
    "fit": FitConfig,
    "runtime": RuntimeConfig,
    "promotion": PromotionConfig,
    "storage": StorageConfig,
}


@dataclass(frozen=True)
class FieldSpec:
    """One configuration field, flattened: what a CLI flag or a form Param needs."""

    section: str
    name: str
    key: str
    type: str  # "integer" | "number" | "boolean" | "string" | "array"
    default: Any
    description: str
    nullable: bool
    deployment: bool
    rules: dict[str, Any]
    says: str | None = None  # the pattern's rule in words

    @property
    def optional(self) -> bool:
        """Empty by default: the field may be left out (empty or null means not set)."""
        return self.default in ("", None, [])

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"


def flat_fields() -> list[FieldSpec]:
    """Every field of every section, in declaration order."""
    json_type = {int: "integer", float: "number", bool: "boolean", str: "string"}
    specs = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            kind, is_list = _field_type(f)
            meta = dict(f.metadata)
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            rules = {
                k: meta[k]
                for k in ("minimum", "maximum", "exclusive_minimum", "enum", "pattern")
                if meta.get(k) is not None
            }
            specs.append(FieldSpec(
                section=section, name=f.name, key=meta["key"] or f.name,
                type="array" if is_list else json_type[kind], default=default,
                description=meta["description"], nullable=bool(meta.get("nullable")),
                deployment=meta["deployment"], rules=rules, says=meta.get("says"),
            ))
    keys = [s.key for s in specs]
    assert len(keys) == len(set(keys)), f"duplicate config keys: {keys}"
    return specs


def property_schema(spec: FieldSpec) -> dict[str, Any]:
    """The JSON Schema of one field (also the trigger form's Param schema)."""
    prop: dict[str, Any] = {
        "type": [spec.type, "null"] if spec.nullable else spec.type,
        "default": spec.default,
        "description": spec.description,
    }
    if spec.type == "array":
        prop["items"] = {"type": "string"}
    rules = dict(spec.rules)
    if "exclusive_minimum" in rules:
        prop["exclusiveMinimum"] = rules.pop("exclusive_minimum")
    prop.update(rules)
    return prop


def json_schema(flat: bool = False) -> dict[str, Any]:
    """JSON Schema of the config: nested by section, or flat by key (the form's shape)."""
    specs = flat_fields()
    if flat:
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {s.key: property_schema(s) for s in specs},
        }
    sections: dict[str, Any] = {}
    for s in specs:
        sec = sections.setdefault(
            s.section, {"type": "object", "additionalProperties": False, "properties": {}}
        )
        sec["properties"][s.name] = property_schema(s)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "RunConfig",
        "type": "object",
        "additionalProperties": False,
        "properties": sections,
    }


@dataclass(frozen=True)
class RunConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    fit: FitConfig = field(default_factory=FitConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)

    # --- construction -------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Build from a nested dict (a JSON config file); unknown keys are errors."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - set(SECTIONS)
        if unknown:
            raise ConfigError(
                f"unknown config section {sorted(unknown)[0]!r}; allowed: "
                + ", ".join(SECTIONS)
            )
        sections = {}
        for name, section_cls in SECTIONS.items():
            values = data.get(name, {})
            if not isinstance(values, Mapping):
                raise ConfigError(f"{name} must be an object, got {values!r}")
            allowed = [f.name for f in dataclasses.fields(section_cls)]
            for key in values:
                if key not in allowed:
                    raise ConfigError(
                        f"unknown config key {name}.{key!s}; allowed: {', '.join(allowed)}"
                    )
            sections[name] = section_cls(**values)
        return cls(**sections)

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> RunConfig:
        """Build from flat keys (CLI flags, Airflow params); unknown keys are errors."""
        return cls().with_overrides(values)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from None
        except RecursionError:
            raise ConfigError("config is nested too deeply to be a config (a config is "
                              "sections of flat values)") from None
        return cls.from_dict(data)

    @classmethod
    def from_file(cls, path: str | Path) -> RunConfig:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {shown(str(path))} is not UTF-8 text (byte "
                              f"{exc.start}): save it as UTF-8 JSON") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {shown(str(path))}: "
                              f"{exc.strerror}") from None
        return cls.from_json(text)

    def with_overrides(self, values: Mapping[str, Any]) -> RunConfig:
        """A new, validated config with flat ``key: value`` overrides applied."""
        by_key = {s.key: s for s in flat_fields()}
        data = self.to_dict()
        for key, value in values.items():
            if key not in by_key:
                close = difflib.get_close_matches(str(key), by_key, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"unknown config key {key!r}{hint}; allowed: {', '.join(sorted(by_key))}"
                )
            spec = by_key[key]
            data[spec.section][spec.name] = value
        return RunConfig.from_dict(data)

    # --- output -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_flat(self) -> dict[str, Any]:
        return {s.key: getattr(getattr(self, s.section), s.name) for s in flat_fields()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def write(self, directory: str | Path) -> Path:
        """Write the effective config as ``config.json`` into ``directory``."""
        path = Path(directory) / "config.json"
        path.write_text(self.to_json())
        return path

    def fingerprint(self) -> str:
        """A short hash of everything that changes the trained model."""
        data = self.to_dict()
        data["storage"] = {}  # where outputs go does not change the model
        data["promotion"] = {}  # nor does the promotion policy
        data["dataset"].pop("staging_dir")
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def run_id(self) -> str:
        """The run's id: given, or derived from the config so a retry lands in place."""
        return self.storage.run_id or (
            f"{self.dataset.name.replace('/', '-')}-{self.model.name}-{self.fingerprint()}"
        )

    @property
    def model_name(self) -> str:
        return self.storage.model_name or f"{self.dataset.name.replace('/', '-')}-{self.model.name}"

    def run_dir(self) -> Path:
        return Path(self.storage.output_dir) / self.run_id
