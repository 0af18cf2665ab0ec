"""``model.warm_start``: the setting (config, CLI flag, trigger form), the rule that
refuses a model whose architecture differs from production's, the run-directory reads
that keep a retry and a resumed run on their own start, and the promotion history's
``warm_started_from``. The whole path on a trained model: tests/integration/test_warm_start.py.
"""

from __future__ import annotations

import json

import keras
import pytest

from training.cli import build_parser, load_config
from training.config import RunConfig, flat_fields
from training.errors import ConfigError
from training.layout import BACKUP_DIR, RUN, model_dir
from training.registry.local import FileStore
from training.registry.versions import ModelRegistry
from training.train import models, warm_start
from training.train.resume import STATE_FILE, WEIGHTS_FILE

AT = "2026-12-01T03:00:00+00:00"


def test_the_setting_is_off_by_default_and_is_a_flag_and_a_form_field():
    assert RunConfig().model.warm_start is False
    spec = next(s for s in flat_fields() if s.key == "warm_start")
    assert (spec.path, spec.type, spec.deployment) == ("model.warm_start", "boolean", False)
    args = build_parser().parse_args(["train", "--warm-start"])
    assert load_config(args).model.warm_start is True
    args = build_parser().parse_args(["train", "--no-warm-start"])
    assert load_config(args).model.warm_start is False
    from training_airflow.params import dag_params

    param = dag_params()["warm_start"]
    assert param.value is False and param.schema["type"] == "boolean"


def test_it_changes_the_run_id_as_every_setting_that_changes_the_model_does():
    assert RunConfig().run_id != RunConfig.from_flat({"warm_start": True}).run_id


@pytest.mark.parametrize(("value", "message"), [
    ("yes", "model.warm_start must be true or false, got 'yes' (str)"),
    (1, "model.warm_start must be true or false, got 1 (int)"),
])
def test_a_value_that_is_not_a_boolean_is_refused_naming_the_field(value, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flat({"warm_start": value})
    assert message in str(err.value)


def test_with_pretrained_backbone_weights_it_could_not_take_effect_and_is_refused():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flat({"model": "mobilenet_v3_small", "warm_start": True,
                             "model_weights": "/weights/mnv3.weights.h5"})
    text = str(err.value)
    assert "model.warm_start is true and model.weights names '/weights/mnv3.weights.h5'" in text
    assert "set model.weights empty to warm-start, or model.warm_start false" in text
    # Each alone is fine, and so is a fine-tuning schedule on a warm start.
    RunConfig.from_flat({"model": "mobilenet_v3_small", "warm_start": True,
                         "freeze_epochs": 1})
    RunConfig.from_flat({"model": "mobilenet_v3_small",
                         "model_weights": "/weights/mnv3.weights.h5"})


def _mlp(shape=(8, 8, 1), classes=10):
    return models.build("mlp", shape, classes)


def test_the_same_architecture_fits_even_built_twice_with_other_layer_names():
    assert warm_start.difference(_mlp(), _mlp()) is None


@pytest.mark.parametrize(("other", "reason"), [
    (lambda: _mlp(classes=5), "the output shape (classes) differs: production's is "
                              "(None, 10), this run's model's (None, 5)"),
    (lambda: _mlp(shape=(28, 28, 1)), "the input shape differs: production's is "
                                      "(None, 8, 8, 1), this run's model's (None, 28, 28, 1)"),
    (lambda: models.build("cnn", (8, 8, 1), 10), "layer 2 is Flatten 'flatten"),
])
def test_another_architecture_is_described_by_its_first_difference(other, reason):
    assert reason in warm_start.difference(_mlp(), other())


def _dense(width: int, layers: int = 1) -> keras.Model:
    inputs = keras.Input((4,))
    x = inputs
    for _ in range(layers):
        x = keras.layers.Dense(width)(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def test_other_weight_shapes_and_more_layers_are_named_with_the_shapes():
    why = warm_start.difference(_dense(8), _dense(16))
    assert why.startswith("layer 1 (Dense '") and why.endswith(
        "has weight shapes (4, 8), (8,) in production, (4, 16), (16,) in this run's model")
    why = warm_start.difference(_dense(8), _dense(8, layers=2))
    assert why.endswith("has weight shapes (8, 3), (3,) in production, (8, 8), (8,) in "
                        "this run's model")
    inputs = keras.Input((4,))
    longer = keras.Model(inputs, keras.layers.Activation("relu", name="extra")(
        keras.layers.Dense(3)(inputs)))
    why = warm_start.difference(_dense(8, layers=0), longer)
    assert why == ("this run's model has more layers (2 in production, 3 in this run's "
                   "model): layer 2 is Activation 'extra'")


def _run_dir(tmp_path, record=None):
    run_dir = tmp_path / "run"
    model_dir(run_dir).mkdir(parents=True)
    if record is not None:
        (model_dir(run_dir) / RUN).write_text(json.dumps({"warm_start": record}))
    return run_dir


def test_a_retry_reads_the_start_its_first_try_recorded(tmp_path):
    assert warm_start.earlier_record(_run_dir(tmp_path / "a")) is None
    assert warm_start.earlier_record(_run_dir(tmp_path / "b", None)) is None  # was off
    pinned = {"from_version": "v1", "model_sha256": "ab", "note": "..."}
    assert warm_start.earlier_record(_run_dir(tmp_path / "c", pinned)) == pinned
    cold = {"from_version": None, "note": "no production model to warm-start from"}
    assert warm_start.earlier_record(_run_dir(tmp_path / "d", cold)) == cold
    broken = _run_dir(tmp_path / "e")
    (model_dir(broken) / RUN).write_text("{not json")
    assert warm_start.earlier_record(broken) is None


def test_a_run_resumes_when_its_backup_holds_weights_even_mid_swap(tmp_path):
    run_dir = _run_dir(tmp_path)
    assert not warm_start.resuming(run_dir)
    backup = run_dir / BACKUP_DIR
    backup.mkdir()
    assert not warm_start.resuming(run_dir)  # an empty directory restores nothing
    (backup / WEIGHTS_FILE).write_bytes(b"weights")
    assert warm_start.resuming(run_dir)
    # A crash between the swap's two renames: only the complete <backup>.new is left.
    backup.rename(run_dir / f"{BACKUP_DIR}.new")
    assert not warm_start.resuming(run_dir)  # incomplete: no state file written last
    (run_dir / f"{BACKUP_DIR}.new" / STATE_FILE).write_text("{}")
    assert warm_start.resuming(run_dir)
    assert not (run_dir / BACKUP_DIR).exists()  # read, not repaired


def test_off_it_does_nothing_and_records_null(tmp_path):
    model = _mlp()
    before = model.get_weights()
    assert warm_start.start(RunConfig(), model, None, tmp_path) is None
    assert all((a == b).all() for a, b in zip(before, model.get_weights(), strict=True))


def _version(root, run_record):
    root.mkdir(parents=True)
    (root / "model.keras").write_bytes(b"not read: the pointer's tests use fake files")
    if run_record is not None:
        (root / RUN).write_text(json.dumps(run_record))
    return root


def test_the_promotion_history_says_which_version_a_promoted_one_started_from(tmp_path):
    registry = ModelRegistry(FileStore(tmp_path / "store"), check_model=False)
    for version, record in (("v1", {"warm_start": None}), ("v2", {"warm_start": {
            "from_version": "v1", "note": "warm-started from v1"}}), ("v3", None)):
        registry.publish("m", version, _version(tmp_path / version, record), run_id=version,
                         created=AT)
        registry.promote("m", version, run_id=version, at=AT, reason="test")
    registry.rollback("m", "v2", run_id="back", at=AT)
    history = registry.history("m")
    assert [r.get("warm_started_from") for r in history] == [None, "v1", None, "v1"]
    assert "warm_started_from" not in history[0]  # only a warm-started version says so
