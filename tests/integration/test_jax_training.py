"""Training on Keras's JAX backend, for real, on this CPU's devices.

JAX fakes several CPU devices in one process (``JAX_NUM_CPU_DEVICES=4``): the same seed
and global batch train on one device, data parallel over 2 and over 4, and model
parallel on a 2x2 (data, model) mesh, in one child process
(``tests/support/jax_training.py``; this process runs Keras on TensorFlow). The tests
read back where each variable lived (its sharding) and compare the final weights, and
that the child never imported TensorFlow. The CLI's JAX child is run as a user runs it:
its outputs, its TensorBoard events, the SavedModel made where TensorFlow is (which
predicts as the JAX model does on the test split).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.cli import cli, last_json, one_error_line
from support.jax_training import train_in_jax

from training.train import fused_steps

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GLOBAL_BATCH = 64


def _flat(staged, output_dir: Path, **settings) -> dict:
    return {"staging_dir": staged.staging_dir, "output_dir": os.fspath(output_dir),
            "backend": "jax", "epochs": 3, "lr_scaling": "none", "seed": 7,
            "early_stopping_patience": 50, "reduce_lr_patience": 50, **settings}


@pytest.fixture(scope="module")
def meshes(staged_digits, tmp_path_factory):
    """One device, data parallel over 2 and 4, model parallel 2x2: one global batch."""
    out = tmp_path_factory.mktemp("jax-meshes")
    runs = {
        "one": _flat(staged_digits, out / "runs", devices=["/cpu:0"], batch_size=64,
                     run_id="one"),
        "dp2": _flat(staged_digits, out / "runs", devices=["/cpu:0", "/cpu:1"],
                     batch_size=32, run_id="dp2"),
        "dp4": _flat(staged_digits, out / "runs", batch_size=16, run_id="dp4"),
        "mp": _flat(staged_digits, out / "runs", batch_size=32, model_parallel=2,
                    run_id="mp"),
    }
    trained = train_in_jax(staged_digits, runs, out, devices=4)
    return out, trained.report, trained.weights


def _run_json(out: Path, run_id: str) -> dict:
    return json.loads((out / "runs" / run_id / "model" / "run.json").read_text())


def test_a_jax_training_process_never_imports_tensorflow(meshes):
    _, report, _ = meshes
    assert report["tensorflow_modules"] == []


def test_each_distribution_is_decided_and_recorded(meshes):
    out, _, _ = meshes
    expected = {"one": ("one_device", 1, 1, 64), "dp2": ("data_parallel", 2, 1, 64),
                "dp4": ("data_parallel", 4, 1, 64), "mp": ("model_parallel", 2, 2, 64)}
    for run_id, (kind, data, model, batch) in expected.items():
        strategy = _run_json(out, run_id)["strategy"]
        assert strategy["backend"] == "jax"
        assert strategy["kind"] == kind, run_id
        assert strategy["mesh"] == {"data": data, "model": model}, run_id
        assert strategy["global_batch_size"] == batch, run_id
        assert strategy["replicas_in_sync"] == data, run_id
    assert _run_json(out, "dp4")["strategy"]["devices"] == [f"/cpu:{i}" for i in range(4)]
    software = _run_json(out, "one")["software"]
    assert software["keras_backend"] == "jax" and "jax" in software
    assert "tensorflow" not in software


def test_variables_are_replicated_under_data_parallel_and_split_under_model_parallel(meshes):
    _, report, _ = meshes
    for name, devices in (("dp2", 2), ("dp4", 4)):
        for path, layout in report[name]["layouts"].items():
            assert layout["devices"] == devices, (name, path)
            assert not any(layout["spec"]), (name, path)  # replicated
    mp = report["mp"]["layouts"]
    kernels = [p for p in mp if p.startswith("dense") and p.endswith("/kernel")]
    assert len(kernels) == 2, list(mp)
    for path in kernels:  # rows split over the model axis, on all 4 devices
        assert mp[path]["spec"][:1] == ["model"], (path, mp[path])
        assert mp[path]["devices"] == 4
    biases = [p for p in mp if p.startswith("dense") and p.endswith("/bias")]
    assert biases and not any(any(mp[p]["spec"]) for p in biases)  # no rule: replicated


def test_every_mesh_trains_the_weights_one_device_trains(meshes):
    """Same seed, same global batch, same examples in the same order: the same weights,
    within float32 reduction order. Over 4 devices the epoch's last batch (42 of
    digits' 1,258 training examples) is cut to 40, 4 equal parts: 2 examples an epoch
    are left out there, so that mesh is only close."""
    _, _, weights = meshes
    for name, atol in (("dp2", 2e-4), ("mp", 2e-4), ("dp4", 2e-2)):
        assert len(weights[name]) == len(weights["one"])
        for mine, single in zip(weights[name], weights["one"], strict=True):
            np.testing.assert_allclose(mine, single, rtol=1e-3, atol=atol, err_msg=name)


@pytest.fixture(scope="module")
def cli_run(staged_digits, tmp_path_factory):
    """``python -m training train --backend jax --evaluate`` as a user runs it."""
    work = tmp_path_factory.mktemp("jax-cli")
    staged = work / "staged.json"
    staged.write_text(json.dumps(staged_digits.to_dict()))
    proc = cli(work, "train", "--backend", "jax", "--staging-dir", staged_digits.staging_dir,
               "--output-dir", os.fspath(work / "runs"), "--store-uri",
               os.fspath(work / "store"), "--epochs", "4", "--staged", os.fspath(staged),
               "--evaluate")
    assert proc.returncode == 0, proc.stderr[-4000:]
    trained = last_json(proc.stdout, "trained")["trained"]
    return work, trained, proc


def test_the_cli_trains_on_jax_and_publishes_a_saved_model_that_predicts_the_same(
        cli_run, staged_digits):
    import keras
    import tensorflow as tf

    from training.data.input.choose import load_builder, make_dataset

    work, trained, proc = cli_run
    model_dir = Path(trained["model_path"]).parent
    record = json.loads((model_dir / "run.json").read_text())
    assert record["strategy"]["backend"] == "jax"
    # digits fits: the fused loop trained it
    assert record["input"] == {"train": "device", "decoded_copy": False, "loop": {
        "form": "unrolled", "platform": "cpu", "why": fused_steps.CPU_WHY}}
    assert record["throughput"]["images_per_s"] > 0
    assert record["throughput"]["accelerator"]["platform"] == "cpu"
    assert (model_dir / "evaluation.json").is_file()
    # The JAX model's predictions on the test split, made in a JAX process of its own.
    predictions = work / "jax-predictions.npy"
    script = (
        "import sys, numpy as np\n"
        "from training import backend; backend.use('jax')\n"
        "import keras\n"
        "from training.data.snapshot.staging import StagedDataset\n"
        "from training.data.input.staged_arrays import StagedArrays\n"
        "images, _ = StagedArrays(StagedDataset.read(sys.argv[2])).arrays('test')\n"
        "model = keras.saving.load_model(sys.argv[1], safe_mode=True)\n"
        "np.save(sys.argv[3], model.predict(images, verbose=0))\n"
        "assert not [m for m in sys.modules if m.startswith('tensorflow')]\n")
    done = subprocess.run([sys.executable, "-c", script, trained["model_path"],
                           os.fspath(work / "staged.json"), os.fspath(predictions)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    jax_probabilities = np.load(predictions)
    served = tf.saved_model.load(trained["saved_model_path"])
    test = make_dataset(load_builder(staged_digits), "test", global_batch_size=512,
                        shuffle=False, seed=0)
    served_probabilities = np.concatenate([served.serve(x).numpy() for x, _ in test])
    assert jax_probabilities.shape == served_probabilities.shape == (359, 10)
    np.testing.assert_allclose(served_probabilities, jax_probabilities, atol=1e-5)
    keras_model = keras.saving.load_model(trained["model_path"], safe_mode=True)
    assert keras_model.count_params() > 0  # the .keras loads under TensorFlow too


def test_the_jax_run_writes_tensorboard_scalars_for_every_epoch(cli_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, trained, _ = cli_run
    board = Path(trained["run_dir"]) / "model" / "tensorboard"
    history = json.loads((Path(trained["run_dir"]) / "model" / "history.json").read_text())
    train = EventAccumulator(os.fspath(board / "train")).Reload()
    validation = EventAccumulator(os.fspath(board / "validation")).Reload()
    assert {"epoch_loss", "epoch_accuracy", "epoch_learning_rate"} <= set(
        train.Tags()["scalars"])
    losses = [e.value for e in validation.Scalars("epoch_loss")]
    assert [e.step for e in validation.Scalars("epoch_loss")] == [0, 1, 2, 3]
    np.testing.assert_allclose(losses, history["metrics"]["val_loss"], rtol=1e-5)


@pytest.mark.parametrize(("flags", "named"), [
    (["--all-reduce", "ring"], ("runtime.all_reduce", "runtime.backend")),
    (["--gradient-pack-mb", "4"], ("runtime.gradient_pack_mb", "runtime.backend")),
    (["--jit-compile"], ("runtime.jit_compile", "runtime.backend")),
    (["--strategy", "mirrored"], ("runtime.strategy", "runtime.backend")),
    (["--model-parallel", "2", "--strategy", "one_device"],
     ("runtime.model_parallel", "runtime.strategy")),
    (["--model-parallel", "3"], ("runtime.model_parallel", "1 device")),
    (["--devices", "/cpu:7"], ("runtime.devices", "/cpu:7")),
    (["--num-gpus", "1"], ("runtime.num_gpus", "0 are visible")),
    (["--workers", "2", "--devices", "/cpu:0"], ("runtime.devices", "runtime.workers")),
])
def test_a_setting_that_cannot_take_effect_under_jax_is_refused(staged_digits, tmp_path,
                                                                flags, named):
    staged = tmp_path / "staged.json"
    staged.write_text(json.dumps(staged_digits.to_dict()))
    proc = cli(tmp_path, "train", "--backend", "jax", "--staging-dir",
               staged_digits.staging_dir, "--output-dir", os.fspath(tmp_path / "runs"),
               "--staged", os.fspath(staged), *flags)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc)
    assert all(name in line for name in named), line
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_layout_rule_refused_in_the_training_process_leaves_no_run_directory(
        staged_digits, tmp_path):
    # The rule is checked against the built model, so the refusal comes from inside the
    # training process (the run left runs/<run id>/model/config.json behind).
    staged = tmp_path / "staged.json"
    staged.write_text(json.dumps(staged_digits.to_dict()))
    proc = cli(tmp_path, "train", "--backend", "jax", "--model-parallel", "2", "--model",
               "support.bad_models:ruled", "--model-name", "mm", "--staging-dir",
               staged_digits.staging_dir, "--output-dir", os.fspath(tmp_path / "runs"),
               "--staged", os.fspath(staged),
               env={"JAX_NUM_CPU_DEVICES": "2", "PYTHONPATH": os.fspath(ROOT / "tests")})
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc)
    assert "layout rule 'no_such_layer/kernel$'" in line and "names no variable" in line
    assert not (tmp_path / "runs").exists()  # nothing written


def test_model_parallel_is_refused_under_tensorflow(tmp_path):
    proc = cli(tmp_path, "train", "--model-parallel", "2", "--output-dir",
               os.fspath(tmp_path / "runs"))
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "runtime.model_parallel" in line and "runtime.backend" in line
    assert not (tmp_path / "runs").exists()


def test_run_stages_on_tensorflow_trains_on_jax_in_a_child_and_publishes(staged_digits,
                                                                         tmp_path):
    """``python -m training run --backend jax``: one command, two processes: staging,
    validation, evaluation of the champion and publishing on TensorFlow, training (and
    its SavedModel's TensorFlow child) in a JAX child."""
    store = tmp_path / "store"
    proc = cli(tmp_path, "run", "--backend", "jax", "--staging-dir",
               staged_digits.staging_dir, "--output-dir", os.fspath(tmp_path / "runs"),
               "--store-uri", os.fspath(store), "--epochs", "3", "--min-accuracy", "0.5")
    assert proc.returncode == 0, proc.stderr[-4000:]
    published = last_json(proc.stdout, "published")["published"]
    assert last_json(proc.stdout, "promotion")["promotion"]["promoted"]
    version = store / "models" / published["model_name"] / "versions" / published["version"]
    run = json.loads((version / "run.json").read_text())
    assert run["strategy"]["backend"] == "jax" and "tensorflow" not in run["software"]
    assert json.loads((version / "evaluation.json").read_text())["backend"] == "jax"
    assert (version / "saved_model" / "saved_model.pb").is_file()


def test_a_tensorflow_process_refuses_to_train_a_jax_config(staged_digits, tmp_path):
    import keras  # noqa: F401  (this process's Keras: TensorFlow)

    from training.config import RunConfig
    from training.errors import ConfigError
    from training.train.fit import train

    cfg = RunConfig.from_flat(_flat(staged_digits, tmp_path / "runs"))
    with pytest.raises(ConfigError, match="runtime.backend is 'jax', but this process's "
                                          "Keras was already imported with backend "
                                          "'tensorflow'"):
        train(cfg, staged_digits)
    assert not (tmp_path / "runs").exists()
