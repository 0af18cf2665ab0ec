"""A training split kept on the device and several steps per dispatch as one compiled
loop (``training.data.device_split``, ``training.train.fused_steps``), on this CPU's JAX
devices.

The loop must compute what Keras's own loop computes: the same seed trains the same
weights at 1 step per dispatch (Keras's train function) and at 5 (one ``lax.scan``), on
one device and data parallel over 2. A SIGTERM lands its backup at the end of the
current group of steps, and the re-run finishes. (Resume after SIGKILL with EarlyStopping
and ReduceLROnPlateau counting, on this path, is ``test_resume.py``'s JAX case.)
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
from support.jax_training import train_in_jax
from support.output import tail

from training.data.device_split import plan

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
    assert records["fused"]["input"] == {"train": "device", "decoded_copy": False}
    assert records["host"]["input"] == {"train": "host", "decoded_copy": False}
    assert "input train: kept on the device (0.1 MB decoded fits in" in log
    assert "input train: fed from the host (dataset.input_cache is 'none')" in log
    assert "train steps: 5 per dispatch, one compiled loop" in log


def test_one_compiled_loop_trains_what_keras_step_by_step_trains(groups):
    _, _, weights = groups
    for name in ("fused", "fused_dp2"):
        for fused, single in zip(weights[name], weights["one_by_one"], strict=True):
            np.testing.assert_allclose(fused, single, rtol=1e-4, atol=1e-5, err_msg=name)


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
