"""Resume after a crash or preemption: real ``python -m training train`` processes, real
signals (SIGKILL after an epoch, SIGTERM inside one), then a re-run of the same command,
on either Keras backend (`runtime.backend`); and SIGTERM to ``python -m training run
--backend jax``, which passes it on to its JAX training child.

The plateau config (lr 0.05, EarlyStopping patience 3, ReduceLROnPlateau patience 2)
makes EarlyStopping and ReduceLROnPlateau count within a few epochs, so the counters
are non-zero when the first run is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import streamed
from support.output import tail

from training.config import RunConfig
from training.data.input.choose import load_builder, make_dataset
from training.files import sha256_file
from training.train.fit import train
from training.train.preemption import EXIT_CODE
from training.train.resume import METADATA_FILE, RESTORED_MARK, STATE_FILE, WEIGHTS_FILE

pytestmark = pytest.mark.slow

PLATEAU = {"epochs": 12, "learning_rate": 0.05, "early_stopping_patience": 3,
           "reduce_lr_patience": 2, "reduce_lr_factor": 0.5}


def _cfg(staged, tmp_path: Path, name: str, **flat) -> tuple[RunConfig, Path]:
    """A one-device config whose run dir is ``tmp_path/name/resume``, and its file."""
    cfg = RunConfig.from_flat({"staging_dir": staged.staging_dir,
                               "output_dir": os.fspath(tmp_path / name), "run_id": "resume",
                               "strategy": "one_device", "backup_interval_s": 0,
                               **flat})
    directory = tmp_path / f"{name}-config"
    directory.mkdir()
    return cfg, cfg.write(directory)


def _run(config: Path, on_line: Callable[[subprocess.Popen, str], None] | None = None,
         hang_guard_s: float = 600, command: str = "train",
         env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """``python -m training COMMAND --config FILE`` (``train``: as the Airflow operator
    runs it); (exit status, output lines). ``on_line(proc, line)`` sees every line as it
    comes. A process still running after ``hang_guard_s`` is killed (a hang fails the
    test on its exit status; nothing here measures time)."""
    return streamed([command, "--config", os.fspath(config)], on_line=on_line,
                    env={"CUDA_VISIBLE_DEVICES": "", **(env or {})},
                    hang_guard_s=hang_guard_s)


def _epoch_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("Epoch ") and "/" in line
            and line.split("/")[0].removeprefix("Epoch ").isdigit()]


def _restored(lines: list[str]) -> dict:
    (line,) = [line for line in lines if RESTORED_MARK in line]
    return json.loads(line.split(RESTORED_MARK, 1)[1])


def _test_accuracy(model_path: str | Path, staged) -> float:
    import keras

    model = keras.saving.load_model(model_path, safe_mode=True)
    test = make_dataset(load_builder(staged), "test",
                        global_batch_size=128, shuffle=False, seed=0)
    return float(model.evaluate(test, verbose=0, return_dict=True)["accuracy"])


BACKENDS = pytest.mark.parametrize("backend", ["tensorflow", "jax"])


@BACKENDS
def test_a_killed_run_resumes_after_its_last_epoch_with_the_callbacks_where_they_were(
    staged_digits, tmp_path, backend
):
    # The same config, uninterrupted, for the accuracy comparison: in this process on
    # TensorFlow (the SIGTERM handler put back after fit), in a JAX process of its own.
    whole_cfg, whole_config = _cfg(staged_digits, tmp_path, "whole", backend=backend,
                                   **PLATEAU)
    if backend == "tensorflow":
        handler = signal.getsignal(signal.SIGTERM)
        whole_path = train(whole_cfg, staged_digits).model_path
        assert signal.getsignal(signal.SIGTERM) is handler  # put back after fit
    else:
        code, lines = _run(whole_config)
        assert code == 0, tail(lines)
        whole_path = whole_cfg.run_dir() / "model" / "model.keras"
    whole_history = json.loads((whole_cfg.run_dir() / "model" / "history.json").read_text())

    cfg, config = _cfg(staged_digits, tmp_path, "killed", backend=backend, **PLATEAU)
    backup = cfg.run_dir() / "backup"
    killed: list[int] = []

    def kill_when_counting(proc: subprocess.Popen, line: str) -> None:
        # The epoch's summary line is printed after its backup was written.
        if killed or " - loss: " not in line:
            return
        state = json.loads((backup / STATE_FILE).read_text())
        callbacks = state["callbacks"]
        if callbacks["early_stopping"]["wait"] and callbacks["reduce_lr_on_plateau"]["wait"]:
            proc.send_signal(signal.SIGKILL)
            killed.append(state["epochs_completed"])

    code, lines = _run(config, kill_when_counting)
    assert killed, "EarlyStopping and ReduceLROnPlateau never both waited:\n" + tail(lines)
    assert code == -signal.SIGKILL
    assert not (cfg.run_dir() / "model" / "model.keras").exists()

    # What the killed run left: the backup of its last finished epoch, with our state.
    state = json.loads((backup / STATE_FILE).read_text())
    k = state["epochs_completed"]
    assert k == killed[0]  # killed inside the next epoch, before its backup
    assert json.loads((backup / METADATA_FILE).read_text())["epoch"] == k
    assert state["format"] == "training.resume/state" and state["version"] == 1
    assert state["mid_epoch"] is None
    assert state["history"]["epochs"] == list(range(1, k + 1))
    saved = state["callbacks"]
    assert saved["early_stopping"]["wait"] >= 1 and saved["reduce_lr_on_plateau"]["wait"] >= 1
    assert saved["early_stopping"]["best_weights"] == "best.weights.h5"
    assert (backup / "best.weights.h5").exists()

    # The re-run (what an Airflow retry runs) resumes after epoch k, counters restored.
    code, lines = _run(config)
    assert code == 0, tail(lines)
    assert _epoch_lines(lines)[0] == f"Epoch {k + 1}/{cfg.fit.epochs}", tail(lines)
    restored = _restored(lines)
    assert restored["epochs_completed"] == k
    for name in ("early_stopping", "reduce_lr_on_plateau", "model_checkpoint"):
        assert restored[name] == saved[name], name
    assert restored["learning_rate"] == pytest.approx(saved["learning_rate"], rel=1e-6)
    assert not backup.exists()  # removed once training ended

    # history.json covers the whole run: the first k epochs are the killed run's.
    history = json.loads((cfg.run_dir() / "model" / "history.json").read_text())
    n = len(history["epochs"])
    assert history["epochs"] == list(range(1, n + 1)) and n > k
    for key, values in state["history"]["metrics"].items():
        assert history["metrics"][key][:k] == pytest.approx(values, rel=1e-6), key
    # The first resumed epoch trained at the restored learning rate.
    assert history["metrics"]["learning_rate"][k] == pytest.approx(saved["learning_rate"])
    es = history["early_stopping"]
    if es["stopped_epoch"] is not None:  # patience counted across the restart
        assert es["stopped_epoch"] - es["best_epoch"] == cfg.fit.early_stopping_patience
        assert len(history["metrics"]["val_loss"]) == es["stopped_epoch"]

    accuracy = _test_accuracy(cfg.run_dir() / "model" / "model.keras", staged_digits)
    whole_accuracy = _test_accuracy(whole_path, staged_digits)
    print(f"killed after epoch {k} with {saved}; resumed run: {n} epochs, stopped "
          f"{es['stopped_epoch']}, best {es['best_epoch']}, test accuracy {accuracy:.4f}; "
          f"uninterrupted: {len(whole_history['epochs'])} epochs, stopped "
          f"{whole_history['early_stopping']['stopped_epoch']}, best "
          f"{whole_history['early_stopping']['best_epoch']}, test accuracy "
          f"{whole_accuracy:.4f}")
    assert abs(accuracy - whole_accuracy) <= 0.01


@BACKENDS
def test_sigterm_inside_an_epoch_writes_a_backup_exits_143_and_a_rerun_completes(
    staged_digits, tmp_path, backend
):
    # Small batches, one per call: epoch 2 lasts long enough to be interrupted inside.
    cfg, config = _cfg(staged_digits, tmp_path, "term", epochs=2, batch_size=8,
                       steps_per_execution=1, backend=backend)
    backup = cfg.run_dir() / "backup"
    files = (WEIGHTS_FILE, METADATA_FILE, STATE_FILE)
    before: dict[str, str] = {}

    def terminate_in_epoch_2(proc: subprocess.Popen, line: str) -> None:
        if before or not line.startswith("Epoch 2/"):
            return
        before.update({f: sha256_file(backup / f) for f in files})  # epoch 1's backup
        proc.send_signal(signal.SIGTERM)  # as SubprocessHook.send_sigterm (its group)

    code, lines = _run(config, terminate_in_epoch_2)
    assert before, tail(lines)
    assert code == EXIT_CODE == 143, tail(lines)
    assert any("SIGTERM received: stopping at the end of this batch" in line
               for line in lines), tail(lines)
    assert any("exiting with status 143" in line for line in lines), tail(lines)
    assert not (cfg.run_dir() / "model" / "model.keras").exists()

    # The backup is no longer epoch 1's: every file was replaced by the one the signal
    # made, marked as taken inside epoch 2.
    for name in files:
        assert sha256_file(backup / name) != before[name], name
    state = json.loads((backup / STATE_FILE).read_text())
    assert state["epochs_completed"] == 1
    assert json.loads((backup / METADATA_FILE).read_text())["epoch"] == 1
    mid = state["mid_epoch"]
    assert mid["epoch"] == 2 and mid["signal"] == "SIGTERM" and mid["batches_done"] >= 1
    assert state["history"]["epochs"] == [1]

    # The re-run repeats epoch 2 from its start and finishes.
    code, lines = _run(config)
    assert code == 0, tail(lines)
    assert _epoch_lines(lines) == ["Epoch 2/2"], tail(lines)
    assert _restored(lines)["mid_epoch"]["batches_done"] == mid["batches_done"]
    history = json.loads((cfg.run_dir() / "model" / "history.json").read_text())
    assert history["epochs"] == [1, 2]
    assert history["metrics"]["loss"][0] == pytest.approx(
        state["history"]["metrics"]["loss"][0], rel=1e-6)
    assert (cfg.run_dir() / "model" / "model.keras").exists()
    assert not backup.exists()


def test_sigterm_to_run_reaches_its_jax_child_which_backs_up_and_a_rerun_resumes_mid_epoch(
    staged_digits, tmp_path
):
    # `run` stages, validates and evaluates in TensorFlow's process and trains in a JAX
    # child of its own process group: the signal goes to `run` alone, not to the group.
    cfg, config = _cfg(staged_digits, tmp_path, "run", epochs=2, batch_size=8,
                       steps_per_execution=1, backend="jax",
                       store_uri=os.fspath(tmp_path / "store"))
    backup = cfg.run_dir() / "backup"
    scratch = tmp_path / "scratch"  # the system temp dir: the child's train-* dir
    scratch.mkdir()
    env = {"TMPDIR": os.fspath(scratch)}
    sent: list[int] = []

    def terminate_in_epoch_2(proc: subprocess.Popen, line: str) -> None:
        if not sent and line.startswith("Epoch 2/"):
            proc.send_signal(signal.SIGTERM)  # `run`'s pid only
            sent.append(proc.pid)

    code, lines = _run(config, terminate_in_epoch_2, command="run", env=env)
    assert sent, tail(lines)
    assert code == EXIT_CODE == 143, tail(lines)  # the child's status
    assert any("SIGTERM received: stopping at the end of this batch" in line
               for line in lines), tail(lines)
    assert lines[-1] == ("error: training exited with code 143 after the SIGTERM passed "
                         "on to it: no error line; see the log above"), tail(lines)
    assert not (cfg.run_dir() / "model" / "model.keras").exists()
    state = json.loads((backup / STATE_FILE).read_text())
    mid = state["mid_epoch"]
    assert mid["epoch"] == 2 and mid["signal"] == "SIGTERM" and mid["batches_done"] >= 1
    assert list(scratch.glob("train-*")) == []

    # The same `run` again resumes inside epoch 2 from that backup, then goes on.
    code, lines = _run(config, command="run", env=env)
    assert code == 0, tail(lines)
    assert _epoch_lines(lines) == ["Epoch 2/2"], tail(lines)
    assert _restored(lines)["mid_epoch"]["batches_done"] == mid["batches_done"]
    assert any(line.startswith('{"promotion"') for line in lines), tail(lines)
    assert json.loads((cfg.run_dir() / "model" / "history.json").read_text())["epochs"] == [1, 2]
    assert not backup.exists() and list(scratch.glob("train-*")) == []


def _tiny_fit(backup_dir: Path, epochs: int, crash_after: int | None = None,
              ran: list[int] | None = None, crash_on_stop: bool = False, **es_kwargs):
    """A tiny model fitted in-process with the resumable callbacks; the backup callback.
    ``ran`` collects the (1-based) epochs this fit ran; it raises after the backup of
    epoch ``crash_after`` or (``crash_on_stop``) of the epoch EarlyStopping stops at."""
    import keras
    import numpy as np

    from training.train.callbacks.backup import ResumableBackup

    class Crash(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if ran is not None:
                ran.append(epoch + 1)
            if epoch + 1 == crash_after or (crash_on_stop and self.model.stop_training):
                raise RuntimeError("crash")

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    es = keras.callbacks.EarlyStopping(**{"patience": 50, "restore_best_weights": True,
                                          **es_kwargs})
    rlr = keras.callbacks.ReduceLROnPlateau(patience=50)
    ckpt = keras.callbacks.ModelCheckpoint(os.fspath(backup_dir.parent / "best.keras"),
                                           save_best_only=True)
    backup = ResumableBackup(backup_dir, early_stopping=es, reduce_lr=rlr, checkpoint=ckpt)
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    model.fit(x, x[:, :2], validation_data=(x, x[:, :2]), epochs=epochs, verbose=0,
              callbacks=[es, rlr, ckpt, backup, Crash()])
    return backup


def test_a_backup_swap_cut_short_by_a_crash_is_completed_and_a_foreign_state_ignored(
    tmp_path, caplog
):
    backup_dir = tmp_path / "backup"
    with pytest.raises(RuntimeError, match="crash"):
        _tiny_fit(backup_dir, epochs=4, crash_after=2)
    # A crash between the two renames of the next backup: the last complete backup is
    # backup.old, and backup.new is half written (no state yet).
    backup_dir.rename(tmp_path / "backup.old")
    (tmp_path / "backup.new").mkdir()
    (tmp_path / "backup.new" / WEIGHTS_FILE).write_bytes(b"half")
    ran: list[int] = []
    with pytest.raises(RuntimeError, match="crash"):
        _tiny_fit(backup_dir, epochs=4, crash_after=3, ran=ran)
    assert ran == [3]  # resumed from backup.old, after epoch 2
    state = json.loads((backup_dir / STATE_FILE).read_text())
    assert state["epochs_completed"] == 3 and state["history"]["epochs"] == [1, 2, 3]
    assert not (tmp_path / "backup.new").exists() and not (tmp_path / "backup.old").exists()

    # A state file this code does not know is not applied; Keras still resumes.
    state["version"] = 99
    (backup_dir / STATE_FILE).write_text(json.dumps(state))
    with caplog.at_level("WARNING", logger="training.train.resume"):
        backup = _tiny_fit(backup_dir, epochs=4)
    assert "version 99" in caplog.text and backup.restored is None
    assert backup.epochs == [3]  # only the epoch it ran: the history was not restored
    assert backup_dir.exists()  # kept until the model is saved: fit.train removes it


def test_a_run_killed_after_early_stopping_ended_it_trains_no_further_epoch(tmp_path):
    backup_dir = tmp_path / "backup"
    stop = {"patience": 1, "min_delta": 100.0}  # nothing improves: stops at epoch 2
    with pytest.raises(RuntimeError, match="crash"):
        _tiny_fit(backup_dir, epochs=6, crash_on_stop=True, **stop)
    state = json.loads((backup_dir / STATE_FILE).read_text())
    assert state["stop_training"] is True and state["epochs_completed"] == 2
    ran: list[int] = []
    backup = _tiny_fit(backup_dir, epochs=6, ran=ran, **stop)
    assert ran == [] and backup.epochs == [0, 1]
    assert backup.early_stopping.stopped_epoch == 1
    assert backup_dir.exists()  # kept until the model is saved: fit.train removes it
