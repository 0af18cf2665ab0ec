"""A training split kept on the device and several steps per dispatch as one compiled
loop (``training.data.input.device_split``, ``training.train.fused_steps``), on this CPU's JAX
devices.

The loop must compute what Keras's own loop computes: the same seed trains the same
weights at 1 step per dispatch and at 5 (one group), on one device and data parallel
over 2; the loop form chosen for a CPU (``fused_steps.loop_form``) adds no compiled loop
around the steps (XLA's CPU backend runs a convolution inside one far slower) and trains
the seed's CNN to Keras's own ``fit``'s weights. A SIGTERM lands its backup at the end
of the current group of steps, and the re-run finishes. (Resume after SIGKILL with
EarlyStopping and ReduceLROnPlateau counting, on this path, is ``test_resume.py``'s JAX
case.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.jax_training import ROOT, train_in_jax
from support.output import tail

from training.data.input.device_split import plan
from training.train import fused_steps

pytestmark = pytest.mark.slow

def _flat(staged, out: Path, run_id: str, **settings) -> dict:
    return {"staging_dir": staged.staging_dir, "output_dir": os.fspath(out),
            "backend": "jax", "epochs": 3, "seed": 3, "run_id": run_id,
            "early_stopping_patience": 50, "reduce_lr_patience": 50, **settings}


@pytest.fixture(scope="module")
def groups(staged_digits, tmp_path_factory):
    out = tmp_path_factory.mktemp("fused")
    runs = {
        "one_by_one": _flat(staged_digits, out / "runs", "one_by_one", batch_size=64,
                            devices=["/cpu:0"], steps_per_execution=1),
        "fused": _flat(staged_digits, out / "runs", "fused", batch_size=64,
                       devices=["/cpu:0"], steps_per_execution=5),
        "fused_dp2": _flat(staged_digits, out / "runs", "fused_dp2", batch_size=32,
                           devices=["/cpu:0", "/cpu:1"], steps_per_execution=5),
        "host": _flat(staged_digits, out / "runs", "host", batch_size=64,
                      devices=["/cpu:0"], input_cache="none"),
    }
    trained = train_in_jax(staged_digits, runs, out, devices=2)
    return out, trained.log, trained.weights


def test_the_training_split_lives_on_the_device_when_it_fits_and_the_log_says_why(groups):
    out, log, _ = groups
    records = {name: json.loads((out / "runs" / name / "model" / "run.json").read_text())
               for name in ("fused", "host")}
    assert records["fused"]["input"] == {
        "train": "device", "decoded_copy": False,
        "loop": {"form": "unrolled", "platform": "cpu", "why": fused_steps.CPU_WHY}}
    assert records["host"]["input"] == {"train": "host", "decoded_copy": False, "loop": None}
    assert "input train: kept on the device (0.1 MB decoded fits in" in log
    assert "input train: fed from the host (dataset.input_cache is 'none')" in log
    assert "train steps: 5 per group, one compiled program per group, its steps unrolled" \
        in log
    assert "the split on the cpu device (on a CPU, XLA runs a convolution" in log


def test_one_compiled_loop_trains_what_keras_step_by_step_trains(groups):
    _, _, weights = groups
    for name in ("fused", "fused_dp2"):
        for fused, single in zip(weights[name], weights["one_by_one"], strict=True):
            np.testing.assert_allclose(fused, single, rtol=1e-4, atol=1e-5, err_msg=name)


# A JAX process of its own (this one runs Keras on TensorFlow): the seed's CNN trained
# by Keras's own fit and by the loop chosen for this CPU, from the same seed, over the
# same batches (13 of 8 in groups of 4: 4, 4, 4, 1, the last batch of 4 images); then
# the compiled loops counted in each form's program and in one train step's.
CPU_LOOP = """
import json

from training import backend

backend.use("jax")
import jax
import keras
import numpy as np

from training.data.input.device_split import DeviceSplit, IndexBatches
from training.train import fused_steps, models


def compiled():
    keras.utils.set_random_seed(7)
    model = models.build("cnn", (12, 12, 3), 4)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"],
                  loss="sparse_categorical_crossentropy", steps_per_execution=4)
    return model


rng = np.random.default_rng(0)
x, y = rng.integers(0, 256, (100, 12, 12, 3), dtype=np.uint8), rng.integers(0, 4, 100)
keras_own = compiled()
keras_own.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
ours, split = compiled(), DeviceSplit(x, y)
ran = fused_steps.install(ours, split)
ours.fit(IndexBatches(split, global_batch_size=8, shuffle=False, seed=0), epochs=2,
         shuffle=False, verbose=0)

state = tuple([v.value for v in variables] for variables in (
    ours.trainable_variables, ours.non_trainable_variables, ours.optimizer.variables,
    ours.metrics_variables))
indices = jax.numpy.arange(32, dtype="int32").reshape(4, 8)
batch = (split.images[indices[0]], split.labels[indices[0]])
loops = {"one step": jax.jit(ours.train_step).lower(state, batch).as_text()}
for form in ("rolled", ran["form"]):
    program = fused_steps.group_function(ours, form).compiled
    loops[form] = program.lower(state, split.images, split.labels, indices).as_text()
np.savez("weights.npz", *keras_own.get_weights(), *ours.get_weights())
print(json.dumps({"ran": ran, "cpu": fused_steps.loop_form("cpu")[0],
                  "loops": {k: text.count("stablehlo.while") for k, text in loops.items()}}))
"""


def test_the_cpu_loop_adds_no_compiled_loop_and_trains_what_keras_fit_trains(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_NUM_CPU_DEVICES": "1",
           "PYTHONPATH": os.fspath(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", CPU_LOOP], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])

    assert found["ran"]["platform"] == "cpu"
    assert found["ran"]["form"] == found["cpu"] != "rolled"
    loops = found["loops"]
    # A group of steps in the CPU's form holds no loop but the ones inside each step
    # (the dropout's random bits); the rolled form, the accelerators', adds its scan.
    assert loops[found["cpu"]] == loops["one step"]
    assert loops["rolled"] == loops["one step"] + 1
    arrays = list(np.load(tmp_path / "weights.npz").values())
    half = len(arrays) // 2
    for keras_own, ours in zip(arrays[:half], arrays[half:], strict=True):
        np.testing.assert_allclose(ours, keras_own, rtol=1e-4, atol=1e-5)


def test_what_stays_on_the_host_and_why():
    def decide(size: int = 1 << 30, **given):
        settings = {"cache": "auto", "augment": "none", "processes": 1,
                    "memory": 4 << 30, "what": "gpu device memory", **given}
        return plan(size, **settings)

    assert decide() == (True, "1,024.0 MB decoded fits in 1,024.0 MB, a quarter of the "
                              "gpu device memory")
    assert decide(size=(1 << 30) + 1)[0] is False
    assert decide(cache="none") == (False, "dataset.input_cache is 'none'")
    assert decide(augment="flip") == (False, "dataset.augment 'flip' runs on the host")
    assert decide(processes=2)[0] is False
    assert decide(memory=None)[0] is False


def test_sigterm_lands_the_backup_at_the_end_of_the_current_group(staged_digits, tmp_path):
    from training.config import RunConfig

    cfg = RunConfig.from_flat(_flat(staged_digits, tmp_path / "runs", "term", epochs=2,
                                    batch_size=8, steps_per_execution=4,
                                    backup_interval_s=0))
    config = cfg.write(tmp_path)
    staged = tmp_path / "staged.json"
    staged.write_text(json.dumps(staged_digits.to_dict()))
    command = [sys.executable, "-m", "training", "train", "--config", os.fspath(config),
               "--staged", os.fspath(staged)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("Epoch 2/") and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, tail(lines)
    state = json.loads((cfg.run_dir() / "backup" / "resume_state.json").read_text())
    mid = state["mid_epoch"]
    assert mid["epoch"] == 2 and mid["signal"] == "SIGTERM", mid
    assert mid["batches_done"] % 4 == 0 or mid["batches_done"] == 158, mid  # a group's end

    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    history = json.loads((cfg.run_dir() / "model" / "history.json").read_text())
    assert history["epochs"] == [1, 2]
