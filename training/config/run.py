"""``RunConfig``: the seven sections together, the rules across fields, the run's identity.

Built from a nested dict (a JSON file), flat keys (CLI flags, Airflow params) or
overrides of another config; validated once, when built, and frozen. The run id and the
model name derive from the config, so a retry lands in the same run directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.config.backend_rules import check_backend
from training.config.schema import FieldSpec, field_specs, property_schema
from training.config.sections import (
    SECTIONS,
    DatasetConfig,
    FitConfig,
    ModelConfig,
    PromotionConfig,
    RuntimeConfig,
    StorageConfig,
    ValidationConfig,
)
from training.config.sweep import SweepConfig, check_sweep
from training.errors import ConfigError, RegistryError, shown
from training.layout import CONFIG, as_name, validate_name


def check_across(cfg: RunConfig) -> None:
    """The rules that span fields, checked whenever a config is built (so in the first
    task of an Airflow run, before anything is staged; the trigger form can only check
    each field alone). A launcher checks only what depends on its own settings."""
    dataset = cfg.dataset
    if dataset.source != "catalog":
        for field_name, key in (("uri", "data_uri"), ("image_shape", "image_shape")):
            if not getattr(dataset, field_name):
                raise ConfigError(
                    f"dataset.{field_name} ({key}) must be set when dataset.source is "
                    f"{dataset.source!r}, got ''")
        if dataset.test_percent + dataset.validation_percent > 80:
            raise ConfigError(
                f"dataset.test_percent + dataset.validation_percent must leave at least "
                f"20% for training, got {dataset.test_percent} + "
                f"{dataset.validation_percent}")
    runtime = cfg.runtime
    if runtime.workers > 1 and runtime.strategy not in ("auto", "multi_worker", "tpu"):
        raise ConfigError(
            f"runtime.strategy must be 'auto' or 'multi_worker' (or 'tpu' for a TPU slice) "
            f"when runtime.workers is more than 1, got {runtime.strategy!r} with "
            f"runtime.workers={runtime.workers}: with {runtime.strategy!r} every worker "
            "would train alone")
    # Settings that cannot take effect under the others: refused, naming both fields.
    if runtime.strategy == "multi_worker" and runtime.workers == 1:
        raise ConfigError(
            "runtime.strategy 'multi_worker' needs runtime.workers above 1, got "
            "runtime.workers=1: one worker would train alone as its own cluster; set "
            "runtime.workers to the number of workers, or runtime.strategy to 'auto'")
    if runtime.tpu and runtime.accelerator != "tpu":
        raise ConfigError(
            f"runtime.tpu names a TPU ({runtime.tpu!r}) but runtime.accelerator is "
            f"{runtime.accelerator!r}: the TPU would be ignored; set runtime.accelerator "
            "to 'tpu' to train on it, or leave runtime.tpu empty")
    check_backend(runtime)  # training.config.backend_rules
    check_sweep(cfg)  # training.config.sweep: the space against the other sections
    # The names a run is stored under, derived or given: refused here, before anything
    # is staged, not by the registry after training.
    for what, name in (("model name (storage.model_name)", cfg.model_name),
                       ("run id (storage.run_id)", cfg.run_id)):
        try:
            validate_name(what, name)
        except RegistryError as exc:
            raise ConfigError(str(exc)) from None


def check_known(keys: Iterable[str], allowed: Collection[str], noun: str,
                listing: str) -> None:
    """The one unknown-key check of flat keys: the first unknown key, the closest known
    one and every key ``allowed`` (``listing`` introduces them)."""
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown {noun} {key!r}{hint}; {listing}: "
                              + ", ".join(sorted(allowed)))


def _nested(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat known keys as ``{section: {field: value}}``."""
    by_key = {s.key: s for s in flat_fields()}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        spec = by_key[key]
        nested.setdefault(spec.section, {})[spec.name] = value
    return nested


def _section(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A section of a nested config, checked to be an object."""
    values = data.get(name, {})
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name} must be an object, got {shown(values)}")
    return values


def flat_fields() -> list[FieldSpec]:
    """Every field of every section, in declaration order."""
    return field_specs(SECTIONS)


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
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    fit: FitConfig = field(default_factory=FitConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)

    def __post_init__(self) -> None:
        check_across(self)

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
            values = _section(data, name)
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
        """Build from flat keys (CLI flags, Airflow params); unknown keys are errors.
        Each value is checked once: the defaults it does not set are not checked first."""
        check_known(values, {s.key for s in flat_fields()}, "config key", "allowed")
        return cls.from_dict(_nested(values))

    @classmethod
    def from_json(cls, text: str, overrides: Mapping[str, Any] | None = None) -> RunConfig:
        """Build from a JSON config (nested by section), with flat ``overrides`` (CLI
        flags) put in before anything is checked: each value is checked once."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from None
        except RecursionError:
            raise ConfigError("config is nested too deeply to be a config (a config is "
                              "sections of flat values)") from None
        if overrides:
            check_known(overrides, {s.key for s in flat_fields()}, "config key", "allowed")
            if isinstance(data, Mapping):
                data = {**data, **{name: {**_section(data, name), **values}
                                   for name, values in _nested(overrides).items()}}
        return cls.from_dict(data)

    @classmethod
    def from_file(cls, path: str | Path,
                  overrides: Mapping[str, Any] | None = None) -> RunConfig:
        """Build from a JSON config file, with flat ``overrides`` (``from_json``)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {shown(str(path))} is not UTF-8 text (byte "
                              f"{exc.start}): save it as UTF-8 JSON") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {shown(str(path))}: "
                              f"{exc.strerror}") from None
        return cls.from_json(text, overrides)

    def with_overrides(self, values: Mapping[str, Any]) -> RunConfig:
        """A new, validated config with flat ``key: value`` overrides applied. Only the
        sections they touch are built (checked) again; the rules across fields, always."""
        check_known(values, {s.key for s in flat_fields()}, "config key", "allowed")
        changed = {}
        for name, overrides in _nested(values).items():
            section = getattr(self, name)
            changed[name] = type(section)(**{**dataclasses.asdict(section), **overrides})
        return dataclasses.replace(self, **changed)

    # --- output -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_flat(self) -> dict[str, Any]:
        return {s.key: getattr(getattr(self, s.section), s.name) for s in flat_fields()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def write(self, directory: str | Path) -> Path:
        """Write the effective config as ``config.json`` into ``directory``."""
        path = Path(directory) / CONFIG
        path.write_text(self.to_json())
        return path

    def fingerprint(self) -> str:
        """A short hash of everything that changes the trained model."""
        data = self._without_sweep_storage()
        data["storage"] = {}  # where outputs go does not change the model
        data["promotion"] = {}  # nor does the promotion policy
        data["validation"] = {}  # nor do the checks the data passed
        data["dataset"].pop("staging_dir")
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def recipe_fingerprint(self) -> str:
        """What a model is trained from besides the data itself: ``fingerprint`` without
        which partitions were asked for (``until``, ``window_days``: the staged data's
        own fingerprint says what they held)."""
        data = self._without_sweep_storage()
        for section in ("storage", "promotion", "validation"):
            data[section] = {}
        for key in ("staging_dir", "until", "window_days"):
            data["dataset"].pop(key)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]

    def _without_sweep_storage(self) -> dict[str, Any]:
        """``to_dict`` for the fingerprints: without a sweep, no ``sweep`` at all (a run's
        id is what it was before sweeps existed); with one, its settings but not where
        its study lives."""
        data = self.to_dict()
        if self.sweep.enabled:
            data["sweep"].pop("storage")
        else:
            del data["sweep"]
        return data

    @property
    def run_id(self) -> str:
        """The run's id: given, or derived from the config so a retry lands in place."""
        return self.storage.run_id or as_name(
            f"{self.dataset.name.replace('/', '-')}-{self.model.name}-{self.fingerprint()}")

    @property
    def model_name(self) -> str:
        """Given, or ``<dataset>-<model>`` made a valid name (a ``package.module:function``
        model's ':' becomes '-')."""
        return self.storage.model_name or as_name(
            f"{self.dataset.name.replace('/', '-')}-{self.model.name}")

    def run_dir(self) -> Path:
        return Path(self.storage.output_dir) / self.run_id
