"""The sweep section and its space: off by default, every bad input one clear ConfigError
(the field, the value received, what is allowed) when the config is built, and a
trial's config is an ordinary run's."""

from __future__ import annotations

import json

import pytest

from training.config.run import RunConfig
from training.config.sweep import MAX_TRIALS, SweepConfig
from training.errors import ConfigError
from training.sweep.space import grid_points, grid_size, parse
from training.sweep.trial import trial_config, trial_run_id

SPACE = {"fit.learning_rate": {"float": [1e-4, 1e-1], "log": True},
         "fit.batch_size": {"choices": [32, 64, 128]},
         "model.args.image_size": {"int": [32, 96]},
         "dataset.augment": {"choices": ["none", "flip"]}}


def swept(sweep: dict | None = None, **sections) -> RunConfig:
    """A config with a sweep section, built as a JSON config file is."""
    return RunConfig.from_dict({**sections, "sweep": sweep or {}})


def backbone(sweep: dict, **sections) -> RunConfig:
    """A sweep of a model that has arguments of every kind (mlp has none)."""
    return swept(sweep, **{"model": {"name": "mobilenet_v3_small"}, **sections})


def test_the_sweep_is_off_by_default_and_says_what_it_would_ignore():
    off = SweepConfig()
    assert not off.enabled and off.space == {} and off.params == {}
    assert swept().sweep == off
    with pytest.raises(ConfigError, match=r"^sweep.pruner is 'hyperband' but sweep.trials "
                                          r"is 0 \(no sweep\): it would be ignored"):
        SweepConfig(pruner="hyperband")
    with pytest.raises(ConfigError, match="sweep.space is .* but sweep.trials is 0"):
        SweepConfig(space={"fit.epochs": {"int": [1, 3]}})
    SweepConfig(storage="postgresql+psycopg2://optuna@db:5432/optuna")  # the deployment's


def test_the_space_is_an_object_or_its_json_text_held_as_one_object():
    as_object = SweepConfig(trials=4, space=SPACE)
    as_text = SweepConfig(trials=4, space=json.dumps(SPACE, indent=2))
    assert as_object == as_text
    assert as_object.space == SPACE and list(as_text.space) == sorted(SPACE)
    params = as_object.params
    assert params["fit.learning_rate"].log and params["fit.learning_rate"].low == 1e-4
    assert params["fit.batch_size"].choices == (32, 64, 128)
    assert params["model.args.image_size"].kind == "int"


def test_the_issue_example_builds():
    cfg = backbone({"trials": 8, "parallel": 2, "space": SPACE})
    assert cfg.sweep.enabled and set(cfg.sweep.params) == set(SPACE)


@pytest.mark.parametrize(("sweep", "message"), [
    ({"trials": 4, "space": {"fit.learnig_rate": {"float": [0.001, 0.1]}}},
     r"sweep.space: unknown field 'fit.learnig_rate' \(did you mean 'fit.learning_rate'\?\); "
     r"fields that may be searched: .*fit.learning_rate.*model.args.<name>"),
    ({"trials": 4, "space": {"dataset.name": {"choices": ["mnist", "digits"]}}},
     "sweep.space: dataset.name cannot be searched: it decides which data"),
    ({"trials": 4, "space": {"dataset.version": {"choices": ["1.0.0", "2.0.0"]}}},
     "sweep.space: dataset.version cannot be searched"),
    ({"trials": 4, "space": {"runtime.backend": {"choices": ["jax", "tensorflow"]}}},
     "sweep.space: runtime.backend cannot be searched: it decides where"),
    ({"trials": 4, "space": {"storage.output_dir": {"choices": ["a", "b"]}}},
     "sweep.space: storage.output_dir cannot be searched: it is a deployment setting"),
    ({"trials": 4, "space": {"storage.store_uri": {"choices": ["a", "b"]}}},
     "storage.store_uri cannot be searched: it is a deployment setting"),
    ({"trials": 4, "space": {"storage.run_id": {"choices": ["a", "b"]}}},
     "storage.run_id cannot be searched: it is a deployment setting"),
    ({"trials": 4, "space": {"model.name": {"choices": ["mlp", "cnn"]}}},
     "sweep.space: model.name cannot be searched: it is the model the sweep tunes"),
    ({"trials": 4, "space": {"sweep.seed": {"int": [1, 9]}}},
     "sweep.space: sweep.seed cannot be searched: it is the sweep itself"),
    ({"trials": 4, "space": {"fit.early_stopping_monitor": {"choices": ["loss", "val_loss"]}}},
     "fit.early_stopping_monitor cannot be searched: it is the sweep's objective"),
    ({"trials": 4, "space": {"model.args": {"choices": ["a", "b"]}}},
     "model.args cannot be searched: search the model's arguments one by one"),
    ({"trials": 4, "space": {"fit.epochs": {"float": [1.0, 5.0]}}},
     r"sweep.space\['fit.epochs'\] is 'float' \{'float': \[1.0, 5.0\]\} but the field is an "
     r"integer; it takes 'int' or 'choices'"),
    ({"trials": 4, "space": {"dataset.augment": {"int": [0, 3]}}},
     r"sweep.space\['dataset.augment'\] is 'int' .* but the field is a string; it takes "
     r"'choices'"),
    ({"trials": 4, "space": {"fit.restore_best_weights": {"int": [0, 1]}}},
     "but the field is a boolean; it takes 'choices'"),
    ({"trials": 4, "space": {"runtime.devices": {"choices": ["/gpu:0", "/gpu:1"]}}},
     "runtime.devices cannot be searched"),
    ({"trials": 4, "space": {"dataset.augment": {"choices": ["none", "rotate"]}}},
     r"sweep.space\['dataset.augment'\]: dataset.augment must be one of 'none', 'flip', "
     r"'crop', 'flip_crop', got 'rotate'"),
    ({"trials": 4, "space": {"fit.batch_size": {"choices": [0, 64]}}},
     r"sweep.space\['fit.batch_size'\]: fit.batch_size must be between 1 and 65536, got 0"),
    ({"trials": 4, "space": {"fit.learning_rate": {"float": [0.0, 0.1]}}},
     "fit.learning_rate must be greater than 0.0 and at most 10.0, got 0.0"),
    ({"trials": 4, "space": {"fit.epochs": {"int": [1, 5000]}}},
     "fit.epochs must be between 1 and 1000, got 5000"),
    ({"trials": 4, "space": {"fit.learning_rate": {"float": [0.1, 0.001]}}},
     r"'float' bounds must rise, low below high, got \[0.1, 0.001\]: swap them"),
    ({"trials": 4, "space": {"fit.epochs": {"int": [5, 5]}}},
     "got \\[5, 5\\]: one value is a setting, not a search"),
    ({"trials": 4, "space": {"fit.min_lr": {"float": [0.0, 0.1], "log": True}}},
     r"sweep.space\['fit.min_lr'\]: a log-scaled range must start above 0, got low 0"),
    ({"trials": 4, "space": {"fit.batch_size": {"choices": []}}},
     r"'choices' must list at least two values, got \[\]"),
    ({"trials": 4, "space": {"fit.batch_size": {"choices": [64]}}},
     r"'choices' must list at least two values, got \[64\]: one value is a setting"),
    ({"trials": 4, "space": {"fit.batch_size": {"choices": [64, 64]}}},
     "choice 64 is listed twice"),
    ({"trials": 4, "space": {"fit.epochs": {"int": [1, 5], "lg": True}}},
     "unknown key 'lg' for a 'int' distribution; allowed: 'int', 'log', 'step'"),
    ({"trials": 4, "space": {"fit.epochs": {"int": [1, 5], "choices": [1, 2]}}},
     "must name exactly one of 'float', 'int', 'choices'"),
    ({"trials": 4, "space": {"fit.epochs": {"int": [1.5, 5]}}},
     r"'int' must be \[low, high\], two integers, got \[1.5, 5\]"),
    ({"trials": 4, "space": {"fit.epochs": [1, 5]}},
     r"sweep.space\['fit.epochs'\] must be a distribution like"),
    ({"trials": 4, "space": "{not json"}, "sweep.space must be a JSON object"),
    ({"trials": 4, "space": {"fit.learning_rate": {"float": [0.001, 0.1], "log": True,
                                                   "step": 0.01}}},
     "'step' and 'log' cannot go together"),
    ({"trials": 4}, "sweep.trials is 4 but sweep.space is empty"),
    ({"trials": 2, "parallel": 3, "space": {"fit.epochs": {"int": [1, 5]}}},
     r"sweep.parallel must be at most sweep.trials \(2\), got 3"),
    ({"trials": MAX_TRIALS + 1, "space": {"fit.epochs": {"int": [1, 5]}}},
     f"sweep.trials must be between 0 and {MAX_TRIALS}, got {MAX_TRIALS + 1}"),
    ({"trials": 4, "sampler": "grid", "space": {"fit.learning_rate": {"float": [0.001, 0.1]}}},
     r"sweep.space\['fit.learning_rate'\] is a float range .* but sweep.sampler is 'grid'"),
    ({"trials": 4, "sampler": "grid", "space": {"fit.epochs": {"int": [1, 64], "log": True}}},
     "is a log-scaled int range"),
    ({"trials": 7, "sampler": "grid", "space": {"fit.epochs": {"int": [1, 3]},
                                                "dataset.augment": {"choices": ["none", "flip"]}}},
     r"sweep.trials is 7 but the grid of sweep.space has 6 points: set sweep.trials to at most 6"),
    ({"trials": 2, "sampler": "grid", "continue_previous": True,
      "space": {"fit.epochs": {"int": [1, 3]}}},
     "sweep.continue is true but sweep.sampler is 'grid'"),
    ({"trials": 2, "sampler": "simulated_annealing"},
     "sweep.sampler must be one of 'tpe', 'random', 'grid', got 'simulated_annealing'"),
    ({"trials": 2, "pruner": "hyperband", "space": {"fit.epochs": {"int": [1, 5]}}},
     "sweep.space searches fit.epochs but sweep.pruner is 'hyperband'"),
])
def test_each_bad_input_is_one_clear_error(sweep, message):
    with pytest.raises(ConfigError, match=message):
        swept(sweep)


@pytest.mark.parametrize(("space", "message"), [
    ({"model.args.units": {"int": [64, 1024]}},
     r"sweep.space: model.args.units is not an argument of model 'mobilenet_v3_small'; its "
     r"arguments: model.args.image_size, model.args.dropout"),
    ({"model.args.image_size": {"float": [32.0, 64.0]}},
     r"sweep.space\['model.args.image_size'\] is 'float' .* but the field is an integer"),
    ({"model.args.flip": {"int": [0, 1]}}, "but the field is a boolean; it takes 'choices'"),
    ({"model.args.dropout": {"float": [0.1, 0.95]}},
     r"sweep.space\['model.args.dropout'\]: model.args.dropout of model "
     r"'mobilenet_v3_small' must be between 0.0 and 0.9, got 0.95"),
    ({"model.args.flip": {"choices": [True, "yes"]}},
     "model.args.flip of model 'mobilenet_v3_small' must be true or false, got 'yes'"),
])
def test_the_models_own_arguments_are_checked_against_its_builder(space, message):
    with pytest.raises(ConfigError, match=message):
        backbone({"trials": 4, "space": space})
    with pytest.raises(ConfigError, match="model.args.units is not an argument of model "
                                          "'mlp'; its arguments: none"):
        swept({"trials": 4, "space": {"model.args.units": {"int": [64, 1024]}}})


def test_a_password_in_the_storage_is_refused_and_never_echoed():
    for url in ("postgresql+psycopg2://optuna:s3cret@db:5432/optuna",
                "postgresql://optuna@db/optuna?sslmode=require&password=s3cret",
                "Postgresql://optuna:s3cret@db/optuna"):
        with pytest.raises(ConfigError, match="sweep.storage must not hold a password") as err:
            SweepConfig(storage=url)
        assert "s3cret" not in str(err.value) and "***" in str(err.value)


def test_pruning_needs_one_process_per_trial():
    space = {"fit.epochs": {"int": [1, 5]}}
    with pytest.raises(ConfigError, match="sweep.pruner is 'median' but runtime.workers is 2"):
        swept({"trials": 2, "space": space}, runtime={"workers": 2})
    swept({"trials": 2, "pruner": "none", "space": space}, runtime={"workers": 2})
    # A Job's pods report nothing to the study: a pruner there would prune nothing.
    with pytest.raises(ConfigError, match=r"sweep.pruner is 'median' but runtime.launcher "
                                          r"is 'kubernetes'"):
        swept({"trials": 2, "space": space}, runtime={"launcher": "kubernetes"})
    swept({"trials": 2, "pruner": "none", "space": space}, runtime={"launcher": "kubernetes"})


def test_a_grid_walks_choices_and_int_ranges_in_a_seeded_order():
    params = parse(SweepConfig(trials=6, sampler="grid", space={
        "fit.epochs": {"int": [1, 5], "step": 2},
        "dataset.augment": {"choices": ["none", "flip"]}}).space)
    assert grid_size(params) == 6
    points = grid_points(params, 6, seed=1)
    assert len({json.dumps(p, sort_keys=True) for p in points}) == 6
    assert {p["fit.epochs"] for p in points} == {1, 3, 5}
    assert grid_points(params, 6, seed=1) == points
    assert grid_points(params, 6, seed=2) != points
    huge = parse({"fit.epochs": {"int": [1, 1000]}, "fit.seed": {"int": [0, 2**31 - 1]}})
    assert grid_size(huge) == 1000 * 2**31
    assert len(grid_points(huge, 3, seed=0)) == 3  # indexed, never listed whole


def test_a_trials_config_is_an_ordinary_run_with_its_own_run_id():
    cfg = backbone({"trials": 4, "space": SPACE}, model={"name": "mobilenet_v3_small",
                                                        "args": {"dropout": 0.3}})
    params = {"fit.learning_rate": 0.01, "fit.batch_size": 32, "model.args.image_size": 48,
              "dataset.augment": "flip"}
    trial = trial_config(cfg, 3, params)
    assert trial.run_id == f"{cfg.run_id}-t3"
    assert trial.run_dir() == cfg.run_dir().parent / f"{cfg.run_id}-t3"
    assert (trial.fit.learning_rate, trial.fit.batch_size, trial.dataset.augment) == (
        0.01, 32, "flip")
    assert trial.model.args == {"dropout": 0.3, "image_size": 48}  # merged key by key
    assert not trial.sweep.enabled and trial.sweep == SweepConfig()
    plain = RunConfig.from_dict({"model": {"name": "mobilenet_v3_small",
                                           "args": {"dropout": 0.3, "image_size": 48}},
                                 "fit": {"learning_rate": 0.01, "batch_size": 32},
                                 "dataset": {"augment": "flip"}})
    # The trial's model is the plain run's: only the sweep section (off) and its run id
    # tell them apart.
    assert {k: v for k, v in trial.to_dict().items() if k not in ("sweep", "storage")} == {
        k: v for k, v in plain.to_dict().items() if k not in ("sweep", "storage")}
    assert trial.fingerprint() == plain.fingerprint()  # the trial hashes as the plain run


def test_a_trial_run_id_stays_a_name_when_the_base_is_long():
    long = swept(storage={"run_id": "r" * 128})
    other = swept(storage={"run_id": "r" * 127 + "s"})
    one, two = trial_run_id(long, 12), trial_run_id(other, 12)
    assert len(one) <= 128 and one.endswith("-t12") and one != two
