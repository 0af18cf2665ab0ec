"""One typed run configuration: dataset, validation, model, fitting, runtime, promotion,
storage.

- ``schema``: how a field is declared, validated and described (one renderer of the
  rules for errors, CLI help, README and the trigger form; JSON Schema);
- ``sections``: the seven sections and their fields;
- ``run``: ``RunConfig``, the cross-field rules and the run's identity.

The same schema drives the command-line flags (``training/cli.py``), JSON config files
(nested by section, unknown keys rejected) and the Airflow trigger form
(``training_airflow.params``). Validation happens once, when a config is built.
"""

from training.config.run import RunConfig, flat_fields, json_schema
from training.config.schema import FieldSpec, allowed, property_schema
from training.config.sections import (
    DEVICE_PATTERN,
    SECTIONS,
    DatasetConfig,
    FitConfig,
    ModelConfig,
    PromotionConfig,
    RuntimeConfig,
    StorageConfig,
    ValidationConfig,
)

__all__ = ["DEVICE_PATTERN", "SECTIONS", "DatasetConfig", "FieldSpec", "FitConfig",
           "ModelConfig", "PromotionConfig", "RunConfig", "RuntimeConfig", "StorageConfig",
           "ValidationConfig", "allowed", "flat_fields", "json_schema", "property_schema"]
