"""A team's own model: found through an installed package's entry point or a
``module:function`` reference, trained end to end; a model that breaks the contract is
refused in one line that names it, before anything trains."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli, last_json, one_error_line

from training.errors import ConfigError
from training.train import models

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_model"
FAST = ["--epochs", "2", "--backup-interval-s", "0", "--min-accuracy", "0"]


def install_example(tmp_path: Path) -> Path:
    """``examples/tiny_model`` installed as a package (a copy is built, not the tree)."""
    source, site = tmp_path / "tiny_model", tmp_path / "site"
    shutil.copytree(EXAMPLE, source)
    done = subprocess.run(
        ["python3", "-m", "uv", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--python", sys.executable, "--target", str(site),
         str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return site


def test_the_example_package_is_found_by_its_entry_point_and_trained(tmp_path):
    site = install_example(tmp_path)
    env = {"PYTHONPATH": str(site)}
    proc = cli(tmp_path, "run", "--model", "tiny_convnet", "--model-args",
               '{"filters": 4, "dropout": 0.1}', *FAST, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version = last_json(proc.stdout, "published")["published"]["version"]
    stored = tmp_path / "var" / "store" / "models" / "digits-tiny_convnet" / "versions"
    config = json.loads((stored / version / "config.json").read_text())
    assert config["model"]["name"] == "tiny_convnet"
    assert config["model"]["args"] == {"filters": 4, "dropout": 0.1}
    # The stored model is the plugin's, and loads safely without the plugin installed.
    check = subprocess.run(
        [sys.executable, "-c", "import keras, sys; m = keras.saving.load_model(sys.argv[1], "
         "safe_mode=True); print(m.name, m.layers[2].filters)",
         str(stored / version / "model.keras")], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-2000:]
    assert check.stdout.split() == ["tiny_convnet", "4"]
    # Unknown arguments are refused before anything is staged or trained.
    (tmp_path / "bad").mkdir()
    bad = cli(tmp_path / "bad", "run", "--model", "tiny_convnet", "--model-args",
              '{"filtres": 4}', env=env)
    assert bad.returncode == 2
    assert one_error_line(bad) == (
        "error: model.args: 'filtres' is not an argument of model 'tiny_convnet'; its "
        "arguments: filters (int, default 16), dropout (float, default 0.2)")
    assert not (tmp_path / "bad" / "var").exists() and not (tmp_path / "bad" / "runs").exists()


def test_a_module_function_reference_trains_without_installing(tmp_path):
    proc = cli(tmp_path, "train", "--model", "tiny_model:tiny_convnet", "--model-args",
               '{"filters": 2}', *FAST, env={"PYTHONPATH": str(EXAMPLE)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    config = json.loads((run_dir / "model" / "config.json").read_text())
    assert config["model"]["name"] == "tiny_model:tiny_convnet"
    assert config["model"]["args"] == {"filters": 2}


@pytest.mark.parametrize("how", [
    [],  # `run` trains in its own process (TensorFlow)
    # `run` stages in TensorFlow's process and trains in a JAX child under its claim of
    # the run; an output directory holding ':' (os.pathsep) checks the claim hand-off
    ["--backend", "jax", "--output-dir", "runs:jax"],
    ["--workers", "2"],  # the local multi-worker launcher's worker processes
], ids=["run", "run-jax", "run-workers"])
def test_a_module_function_reference_runs_publishes_and_promotes_by_every_path(tmp_path, how):
    # No --model-name: the default '<dataset>-<model>' must be a valid name for it.
    proc = cli(tmp_path, "run", "--model", "tiny_model:tiny_convnet", "--model-args",
               '{"filters": 2}', *FAST, *how, env={"PYTHONPATH": str(EXAMPLE)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    promotion = last_json(proc.stdout, "promotion")["promotion"]
    assert promotion["model_name"] == "digits-tiny_model-tiny_convnet"
    assert promotion["promoted"] is True
    stored = (tmp_path / "var" / "store" / "models" / "digits-tiny_model-tiny_convnet"
              / "versions" / promotion["version"])
    config = json.loads((stored / "config.json").read_text())
    assert config["model"]["name"] == "tiny_model:tiny_convnet"
    assert config["runtime"]["backend"] == ("jax" if "jax" in how else "tensorflow")


def test_a_name_refused_is_refused_before_anything_is_staged(tmp_path):
    proc = cli(tmp_path, "run", "--model", "tiny_model:tiny_convnet", "--model-name",
               "mine:v2", env={"PYTHONPATH": str(EXAMPLE)})
    assert proc.returncode == 2
    assert one_error_line(proc).startswith(
        "error: storage.model_name must be empty, or a registry name of 1 to 128")
    assert not (tmp_path / "var").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("name", "args", "message"), [
    ("support.bad_models:three_outputs", {},
     "model 'support.bad_models:three_outputs' outputs (None, 3); the dataset has 10 "
     "classes: it must output (batch, 10)"),
    ("support.bad_models:broken", {"width": 3},
     "model 'support.bad_models:broken' failed to build for input (8, 8, 1) and 10 "
     "classes (RuntimeError: no layer is 3 wide today)"),
    ("support.bad_models:broken", {"width": "3"},
     "model.args.width of model 'support.bad_models:broken' must be an integer, got '3' "
     "(str)"),
    ("support.bad_models:untyped", {},
     "model 'support.bad_models:untyped': argument 'width' needs a default and an "
     "annotation of int, float, bool or str"),
    ("support.bad_models:missing", {},
     "model 'support.bad_models:missing': cannot load the reference (AttributeError: "
     "module 'support.bad_models' has no attribute 'missing')"),
])
def test_a_model_that_breaks_the_contract_is_refused_naming_it(name, args, message):
    with pytest.raises(ConfigError) as refused:
        models.build(name, (8, 8, 1), 10, args)
    assert str(refused.value) == message
