"""Several JAX processes on this host: ``runtime.workers`` 2 under ``backend: jax``.

The local launcher starts two real workers; they join through ``jax.distributed`` (gloo
collectives on the CPU), worker 0's address from the same ``TF_CONFIG`` the TensorFlow
path uses being the coordinator. Each reads its own half of every global batch. The
tests check what the TensorFlow multi-worker tests check: the same final weights on
both, only the chief writes, a killed worker fails the run naming it, and a re-run
resumes on both from the chief's backup.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from support.output import tail

from training.config import RunConfig
from training.launch import local

pytestmark = pytest.mark.slow


def _cfg(tmp_path: Path, staged, **flat) -> RunConfig:
    return RunConfig.from_flat({
        "staging_dir": staged.staging_dir, "output_dir": os.fspath(tmp_path / "runs"),
        "backend": "jax", "workers": 2, "epochs": 3, "batch_size": 32,
        "backup_interval_s": 0, **flat,
    })


def _reports(report_dir: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text())
            for p in sorted(report_dir.glob("worker-*.json"))}


def test_two_jax_processes_train_the_same_weights_and_only_the_chief_writes(
        tmp_path, staged_digits, capsys):
    import keras

    from training.train.callbacks.weights_report import weights_digest

    cfg = _cfg(tmp_path, staged_digits, augment="flip_crop")
    report_dir = tmp_path / "report"
    result = local.run(cfg, staged=staged_digits, report_dir=report_dir, timeout_s=300)
    out = capsys.readouterr().out
    assert result.returncode == 0, tail(out)
    reports = _reports(report_dir)
    assert reports[0]["digest"] == reports[1]["digest"] == result.digests[0]
    for mine, theirs in zip(reports[0]["epochs"], reports[1]["epochs"], strict=True):
        assert mine == pytest.approx(theirs, rel=1e-6)
    assert "Connecting to JAX distributed service on 127.0.0.1:" in out
    run_dir = Path(result.run_dir)
    run = json.loads((run_dir / "model" / "run.json").read_text())
    assert run["strategy"]["backend"] == "jax"
    assert run["strategy"]["kind"] == "multi_worker"
    assert run["strategy"]["processes"] == 2
    assert run["strategy"]["global_batch_size"] == 64
    model = keras.saving.load_model(run_dir / "model" / "model.keras", safe_mode=True)
    assert weights_digest(model) == reports[0]["digest"]
    assert (run_dir / "model" / "saved_model" / "saved_model.pb").is_file()  # chief only
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]


def test_a_killed_jax_worker_fails_the_run_naming_it_and_a_rerun_resumes_on_both(
        tmp_path, staged_digits, capsys):
    cfg = _cfg(tmp_path, staged_digits)
    run_dir = cfg.run_dir()
    procs: list[subprocess.Popen] = []
    killed: list[int] = []

    def on_line(index: int, line: str) -> None:
        if index == 0 and " - loss: " in line and not killed:  # after epoch 1's backup
            procs[1].send_signal(signal.SIGKILL)
            killed.append(procs[1].pid)

    result = local.run(cfg, staged=staged_digits, on_start=procs.extend, on_line=on_line,
                       grace_s=30, timeout_s=300)
    out = capsys.readouterr().out
    assert killed, tail(out)
    assert result.failed_worker == 1, tail(out)
    assert "worker 1 was killed by SIGKILL" in result.reason
    assert not (run_dir / "model" / "model.keras").exists()
    saved = json.loads((run_dir / "backup" / "training_metadata.json").read_text())
    assert 1 <= saved["epoch"] < cfg.fit.epochs

    report_dir = tmp_path / "report"
    result = local.run(cfg, staged=staged_digits, report_dir=report_dir, timeout_s=300)
    out = capsys.readouterr().out
    assert result.returncode == 0, tail(out)
    reports = _reports(report_dir)
    resumed = list(range(saved["epoch"] + 1, cfg.fit.epochs + 1))
    assert [e["epoch"] for e in reports[0]["epochs"]] == resumed
    assert [e["epoch"] for e in reports[1]["epochs"]] == resumed  # from the chief's backup
    assert reports[0]["digest"] == reports[1]["digest"]
    history = json.loads((run_dir / "model" / "history.json").read_text())
    assert history["epochs"] == list(range(1, cfg.fit.epochs + 1))  # the whole run
    assert not (run_dir / "backup").exists()
