import json
import re

import pytest

from training.config import RunConfig, flat_fields, json_schema
from training.errors import ConfigError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"epochs": 0}, "fit.epochs must be between 1 and 1000, got 0"),
        ({"batch_size": -1}, "fit.batch_size must be between 1 and 65536, got -1"),
        ({"model": "nope"}, "model.name 'nope' is not a model: built in mlp, cnn"),
        ({"lr_scaling": "cubic"}, "fit.lr_scaling must be one of 'none', 'linear', 'sqrt'"),
        ({"learning_rate": 0}, "fit.learning_rate must be greater than 0.0"),
        ({"learning_rate": float("nan")}, "fit.learning_rate must be a finite number, got nan"),
        ({"epochs": "3"}, "fit.epochs must be between 1 and 1000, got '3' (str)"),
        ({"epochs": True}, "got True (bool)"),
        ({"restore_best_weights": "yes"}, "fit.restore_best_weights must be true or false"),
        ({"devices": ["gpu0"]}, "runtime.devices must hold device names like /gpu:0"),
        ({"dataset": "../etc"}, "dataset.name must be a dataset name: lower-case letters"),
        ({"run_id": "a/b"}, "storage.run_id must be empty, or a run id of 1 to 128 letters"),
        ({"validation_fraction": 0.9}, "dataset.validation_fraction must be greater than 0.0"
                                        " and at most 0.5, got 0.9"),
    ],
)
def test_bad_values_name_field_value_and_allowed(overrides, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flat(overrides)
    assert message in str(err.value)


def test_unknown_keys_are_rejected_flat_nested_and_by_section():
    with pytest.raises(ConfigError, match=r"unknown config key 'epoch' \(did you mean "
                                          r"'epochs'\?\); allowed: .*epochs"):
        RunConfig.from_flat({"epoch": 3})
    with pytest.raises(ConfigError, match=r"unknown config key fit.epoch; allowed: epochs"):
        RunConfig.from_dict({"fit": {"epoch": 3}})
    with pytest.raises(ConfigError, match="unknown config section 'fitting'"):
        RunConfig.from_dict({"fitting": {}})


def test_json_round_trip_keeps_every_value():
    cfg = RunConfig.from_flat({"epochs": 7, "devices": ["/gpu:0", "/gpu:1"], "dataset_version":
                               "3.0.1", "restore_best_weights": False, "learning_rate": 3e-4})
    again = RunConfig.from_json(cfg.to_json())
    assert again == cfg
    assert again.runtime.devices == ["/gpu:0", "/gpu:1"]
    assert RunConfig.from_flat(cfg.to_flat()) == cfg


def test_config_is_frozen_and_overrides_make_a_new_validated_one():
    cfg = RunConfig()
    with pytest.raises(AttributeError):
        cfg.fit.epochs = 5  # type: ignore[misc]
    assert cfg.with_overrides({"epochs": 5}).fit.epochs == 5
    assert cfg.fit.epochs == 30


def test_run_id_derives_from_what_changes_the_model_only():
    a = RunConfig()
    assert a.run_id == RunConfig().run_id  # deterministic: a retry lands in place
    assert a.run_id != a.with_overrides({"epochs": 5}).run_id
    assert a.run_id == a.with_overrides({"output_dir": "elsewhere"}).run_id
    assert a.with_overrides({"run_id": "nightly-1"}).run_id == "nightly-1"


def test_write_puts_effective_config_next_to_outputs(tmp_path):
    cfg = RunConfig.from_flat({"epochs": 4})
    path = cfg.write(tmp_path)
    assert RunConfig.from_file(path) == cfg


def test_file_errors_are_config_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config is not valid JSON"):
        RunConfig.from_file(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="cannot read config file"):
        RunConfig.from_file(tmp_path / "missing.json")


def test_schema_exports_every_field_with_type_default_bounds_enum_description():
    schema = json_schema()
    fit = schema["properties"]["fit"]
    assert fit["additionalProperties"] is False
    epochs = fit["properties"]["epochs"]
    assert epochs == {"type": "integer", "default": 30, "minimum": 1, "maximum": 1000,
                      "description": "Maximum number of epochs."}
    model = schema["properties"]["model"]["properties"]
    assert "enum" not in model["name"] and re.fullmatch(model["name"]["pattern"], "pkg.mod:fn")
    assert model["args"]["type"] == "object" and model["args"]["default"] == {}
    assert schema["properties"]["fit"]["properties"]["learning_rate"]["exclusiveMinimum"] == 0
    flat = json_schema(flat=True)["properties"]
    assert set(flat) == {s.key for s in flat_fields()}
    assert flat["dataset_version"]["type"] == ["string", "null"]
    json.dumps(schema)  # serialisable as is


def test_schema_defaults_are_a_valid_config():
    defaults = {k: v["default"] for k, v in json_schema(flat=True)["properties"].items()}
    assert RunConfig.from_flat(defaults) == RunConfig()


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_several_workers_need_a_strategy_that_spans_them(strategy):
    with pytest.raises(ConfigError, match=(
            f"runtime.strategy must be 'auto' or 'multi_worker' .* got '{strategy}' with "
            f"runtime.workers=2: with '{strategy}' every worker would train alone")):
        RunConfig.from_flat({"workers": 2, "strategy": strategy})
    # the same rule from a JSON file and from a config's overrides
    with pytest.raises(ConfigError, match="every worker would train alone"):
        RunConfig.from_dict({"runtime": {"workers": 3, "strategy": strategy}})
    with pytest.raises(ConfigError, match="every worker would train alone"):
        RunConfig.from_flat({"strategy": strategy}).with_overrides({"workers": 2})
    for fine in ("auto", "multi_worker", "tpu"):
        assert RunConfig.from_flat({"workers": 2, "strategy": fine}).runtime.workers == 2


def test_every_rule_reads_the_same_in_errors_help_and_tables():
    from training.cli import build_parser, markdown_table

    spec = next(s for s in flat_fields() if s.key == "epochs")
    assert spec.allowed == "between 1 and 1000"
    with pytest.raises(ConfigError, match="fit.epochs must be between 1 and 1000, got 0"):
        RunConfig.from_flat({"epochs": 0})
    train_help = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "Allowed: between 1 and 1000." in " ".join(train_help.split())
    assert "| between 1 and 1000 |" in markdown_table()


def test_own_data_needs_its_location_and_image_shape():
    with pytest.raises(ConfigError, match=r"dataset.uri \(data_uri\) must be set when "
                                          r"dataset.source is 'images', got ''"):
        RunConfig.from_flat({"data_source": "images", "image_shape": "28x28x1"})
    with pytest.raises(ConfigError, match=r"dataset.image_shape \(image_shape\) must be set"):
        RunConfig.from_flat({"data_source": "tfrecord", "data_uri": "s3://bucket/data"})
    with pytest.raises(ConfigError, match="dataset.image_shape must be empty, or height x "
                                          "width x channels like 28x28x1"):
        RunConfig.from_flat({"image_shape": "28x28x2"})
    with pytest.raises(ConfigError, match=r"must leave at least 20% for training, got 50 \+ 40"):
        RunConfig.from_flat({"data_source": "images", "data_uri": "d", "image_shape": "8x8x1",
                             "test_percent": 50, "validation_percent": 40})
    cfg = RunConfig.from_flat({"data_source": "images", "data_uri": "s3://team/images",
                               "image_shape": "28x28x1", "data_until": "2026-12-01"})
    assert cfg.dataset.until == "2026-12-01"
    # the checks the data passed do not change the model: same run id
    assert cfg.with_overrides({"drift_threshold": 0.5}).run_id == cfg.run_id
    assert cfg.with_overrides({"data_until": "2026-12-02"}).run_id != cfg.run_id
