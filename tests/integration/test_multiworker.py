"""Local multi-worker training: real worker processes under MultiWorkerMirroredStrategy.

The fast tests drive ``launch.local.run`` with a fake worker program (no TensorFlow):
cluster spec, log prefixes, fail-fast, SIGTERM -> SIGKILL, signals to the launcher.
The slow ones train the mlp on digits with two real workers on CPU. No test measures
time: how a run ended (exit codes, the launcher's reason, what a worker printed) says
whether the launcher acted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
from support.output import tail

from training.config import RunConfig
from training.errors import ConfigError
from training.launch import local
from training.launch.worker import DIGEST_MARK
from training.train import cluster

FAKE_WORKER = """\
import json, os, signal, sys, time
task = json.loads(os.environ["TF_CONFIG"])
index = task["task"]["index"]
mode = os.environ["FAKE_MODE"]
print("cluster", json.dumps(task["cluster"]), flush=True)
print("pid", os.getpid(), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
if mode in ("fail", "stubborn") and index == 1:
    time.sleep(0.5)
    sys.exit(3)
if mode == "ok":
    sys.exit(0)
time.sleep(60)
print("slept", flush=True)
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """An executable that stands in for ``python -m training.launch.worker ...``."""
    path = tmp_path / "fake-python"
    path.write_text(f"#!{sys.executable}\n{FAKE_WORKER}")
    path.chmod(0o755)
    return os.fspath(path)


def _cfg(tmp_path: Path, **flat) -> RunConfig:
    return RunConfig.from_flat({"output_dir": os.fspath(tmp_path / "runs"), "workers": 2,
                                **flat})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- fast: the launcher itself ---------------------------------------------------------

def test_free_ports_are_distinct_and_a_cluster_names_them_on_loopback():
    ports = local.free_ports(3)
    assert len(set(ports)) == 3
    hosts = [f"127.0.0.1:{p}" for p in ports]
    assert json.loads(cluster.build(hosts, 2)) == {"cluster": {"worker": hosts},
                                                   "task": {"type": "worker", "index": 2}}


def test_a_single_device_strategy_cannot_run_on_several_workers(tmp_path):
    with pytest.raises(ConfigError, match="runtime.strategy must be 'auto' or "
                                          "'multi_worker' .* got 'one_device'"):
        local.run(_cfg(tmp_path, strategy="one_device"), staged={})


def test_workers_get_their_own_tf_config_and_prefixed_logs(tmp_path, fake_python,
                                                           monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MODE", "ok")
    monkeypatch.setenv("TF_CONFIG", "stale")  # the launcher's own is never passed on
    result = local.run(_cfg(tmp_path), staged={}, python=fake_python)
    assert result.returncode == 0 and result.exit_codes == [0, 0]
    assert result.run_dir == os.fspath(_cfg(tmp_path).run_dir())
    lines = capsys.readouterr().out.splitlines()
    clusters = {line.split(" ", 3)[3] for line in lines if " cluster " in line}
    assert len(clusters) == 1  # both workers were given the same cluster
    (workers,) = clusters
    assert [h.split(":")[0] for h in json.loads(workers)["worker"]] == ["127.0.0.1"] * 2
    assert "[worker 0] to stderr" in lines and "[worker 1] to stderr" in lines


def test_a_failing_worker_stops_the_others(tmp_path, fake_python, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MODE", "fail")
    result = local.run(_cfg(tmp_path), staged={}, python=fake_python, grace_s=5)
    assert result.returncode == 3 and result.failed_worker == 1
    assert result.reason == "worker 1 exited with status 3; stopping the others"
    # Worker 0 (a 60 s sleep) was ended by the launcher's SIGTERM, not by finishing.
    assert result.exit_codes == [-signal.SIGTERM, 3]
    assert "[worker 0] slept" not in capsys.readouterr().out


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(
    tmp_path, fake_python, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_MODE", "stubborn")
    result = local.run(_cfg(tmp_path), staged={}, python=fake_python, grace_s=1)
    assert result.returncode == 3
    out = capsys.readouterr().out
    # SIGTERM first (the worker said it ignored it), then SIGKILL ended it mid-sleep.
    assert "[worker 0] ignoring SIGTERM" in out, out
    assert result.exit_codes == [-signal.SIGKILL, 3]
    assert "[worker 0] slept" not in out


def test_sigterm_to_the_launcher_reaches_the_workers(tmp_path, fake_python):
    driver = textwrap.dedent(f"""
        import json, sys
        from training.config import RunConfig
        from training.launch.local import run
        cfg = RunConfig.from_flat({{"output_dir": {os.fspath(tmp_path)!r}, "workers": 2}})
        result = run(cfg, staged={{}}, python={fake_python!r}, grace_s=5)
        print("exit codes", json.dumps(result.exit_codes), flush=True)
        sys.exit(result.returncode)
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "FAKE_MODE": "sleep"})
    pids: dict[str, int] = {}
    for line in proc.stdout:
        match = re.match(r"\[worker (\d)\] pid (\d+)", line)
        if match:
            pids[match[1]] = int(match[2])
        if len(pids) == 2:
            break
    assert all(_alive(pid) for pid in pids.values())
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=300) == 128 + signal.SIGTERM  # timeout: a hang guard only
    # Both workers (60 s sleeps) were ended by the SIGTERM the launcher passed on.
    assert f"exit codes {json.dumps([-signal.SIGTERM] * 2)}" in rest, rest
    assert "slept" not in rest
    assert not any(_alive(pid) for pid in pids.values())


# --- slow: real training ---------------------------------------------------------------

def _train_cfg(tmp_path: Path, staged, **flat) -> RunConfig:
    return RunConfig.from_flat({
        "staging_dir": staged.staging_dir, "output_dir": os.fspath(tmp_path / "runs"),
        "workers": 2, "epochs": 3, "batch_size": 32, "backup_interval_s": 0, **flat,
    })


def _reports(report_dir: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text())
            for p in sorted(report_dir.glob("worker-*.json"))}


@pytest.mark.slow
def test_two_workers_train_in_lockstep_and_only_the_chief_writes(tmp_path, staged_digits,
                                                                 capsys):
    import keras

    from training.train.callbacks.weights_report import weights_digest

    # With augmentation: the seeded stream goes through the data sharding of 2 workers.
    cfg = _train_cfg(tmp_path, staged_digits, augment="flip_crop")
    report_dir = tmp_path / "report"
    result = local.run(cfg, staged=staged_digits, report_dir=report_dir, timeout_s=300)
    out = capsys.readouterr().out
    assert result.returncode == 0, tail(out)
    reports = _reports(report_dir)
    assert sorted(reports) == [0, 1]

    # The same weights and the same per-epoch logs on both workers: all-reduced.
    assert reports[0]["digest"] == reports[1]["digest"] == result.digests[0] \
        == result.digests[1]
    assert [e["epoch"] for e in reports[0]["epochs"]] == [1, 2, 3]
    for mine, theirs in zip(reports[0]["epochs"], reports[1]["epochs"], strict=True):
        assert mine == pytest.approx(theirs, rel=1e-6)
    losses = [e["loss"] for e in reports[0]["epochs"]]
    assert losses[-1] < losses[0]  # it learned

    # The chief's run dir holds the model, with exactly the chief's final weights.
    run_dir = Path(result.run_dir)
    model = keras.saving.load_model(run_dir / "model" / "model.keras", safe_mode=True)
    assert weights_digest(model) == reports[0]["digest"]
    history = json.loads((run_dir / "model" / "history.json").read_text())
    assert history["metrics"]["loss"] == pytest.approx(losses, rel=1e-6)
    run = json.loads((run_dir / "model" / "run.json").read_text())
    assert run["strategy"]["kind"] == "multi_worker"
    assert run["strategy"]["replicas_in_sync"] == 2
    assert run["strategy"]["global_batch_size"] == 64
    assert result.trained["model_path"] == os.fspath(run_dir / "model" / "model.keras")
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]

    # The non-chief wrote to a temporary directory that is gone.
    worker_dirs = set(re.findall(r"\[worker 1\] .*Assets written to: (\S+?)/model/", out))
    assert worker_dirs and not any(Path(d).exists() for d in worker_dirs)
    assert all("/launch-" in d for d in worker_dirs)  # under the launcher's TMPDIR
    assert str(run_dir) not in "".join(worker_dirs)


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_and_a_rerun_resumes_on_both(
    tmp_path, staged_digits, capsys, monkeypatch
):
    cfg = _train_cfg(tmp_path, staged_digits)
    run_dir = cfg.run_dir()
    procs: list[subprocess.Popen] = []
    killed: list[int] = []

    def on_line(index: int, line: str) -> None:
        # The chief prints an epoch's summary after BackupAndRestore saved that epoch.
        if index == 0 and " - loss: " in line and not killed:
            procs[1].send_signal(signal.SIGKILL)
            killed.append(procs[1].pid)

    scratch = tmp_path / "scratch"  # where the launcher makes its launch directory
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", os.fspath(scratch))
    result = local.run(cfg, staged=staged_digits, on_start=procs.extend, on_line=on_line,
                       grace_s=60, timeout_s=300)  # a loaded machine tears TF down slowly
    monkeypatch.undo()
    out = capsys.readouterr().out
    assert killed, tail(out)
    assert result.returncode == 128 + signal.SIGKILL and result.failed_worker == 1, tail(out)
    assert result.exit_codes[1] == -signal.SIGKILL
    assert "worker 1 was killed by SIGKILL" in result.reason
    # The chief did not hang in its all-reduce with no peer (137, not the timeout's 124;
    # not left for SIGKILL after the grace period): the launcher's SIGTERM ended it, or
    # it failed first on its own because the collective was aborted.
    chief_aborted = "[worker 0] error: " in out and "Collective ops is aborted" in out
    assert result.exit_codes[0] == -signal.SIGTERM or (
        result.exit_codes[0] == 1 and chief_aborted), (result.exit_codes, tail(out))
    assert not (run_dir / "model" / "model.keras").exists()
    assert list(scratch.iterdir()) == []  # the killed non-chief's temp run dir is gone
    assert (run_dir / "backup" / "training_metadata.json").exists()
    saved_epoch = json.loads((run_dir / "backup" / "training_metadata.json").read_text())
    assert 1 <= saved_epoch["epoch"] < cfg.fit.epochs

    # A re-run resumes from the chief's backup on both workers, in step.
    report_dir = tmp_path / "report"
    result = local.run(cfg, staged=staged_digits, report_dir=report_dir, timeout_s=300)
    out = capsys.readouterr().out
    assert result.returncode == 0, tail(out)
    reports = _reports(report_dir)
    resumed = list(range(saved_epoch["epoch"] + 1, 4))
    assert [e["epoch"] for e in reports[0]["epochs"]] == resumed
    assert [e["epoch"] for e in reports[1]["epochs"]] == resumed
    assert reports[0]["digest"] == reports[1]["digest"]
    assert (run_dir / "model" / "model.keras").exists()
    assert not (run_dir / "backup").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("switch", "upstream_error"), [
    ("off", "Attempt to convert a value (PerReplica"),
    ("without:reduce_scalar_logs", "Invalid reduction dimension 0 for input with 0 dimensions"),
], ids=["no-compat", "without-reduce-patch"])
def test_without_the_compat_layer_keras_fails_as_upstream_reports(
    tmp_path, staged_digits, switch, upstream_error, monkeypatch, capsys
):
    import keras

    cfg = _train_cfg(tmp_path, staged_digits, epochs=1)
    monkeypatch.setenv("TRAINING_KERAS_COMPAT", switch)  # for the workers
    result = local.run(cfg, staged=staged_digits, grace_s=5, timeout_s=180)
    out = capsys.readouterr().out
    assert result.returncode != 0, (
        f"keras {keras.__version__} trained under MultiWorkerMirroredStrategy with "
        f"TRAINING_KERAS_COMPAT={switch}: the upstream bug (keras-team/keras#20585) looks "
        f"fixed; check training.train.keras_patches.needed() and retire the patch"
    )
    assert upstream_error in out, tail(out)
    assert not (cfg.run_dir() / "model" / "model.keras").exists()


def test_a_run_whose_workers_disagree_fails(tmp_path, fake_python, monkeypatch):
    """Digests that differ mean the gradients were not all-reduced: the run fails."""
    script = Path(fake_python)
    script.write_text(script.read_text().replace(
        'if mode == "ok":',
        f'print("{DIGEST_MARK}" + str(index), flush=True)\nif mode == "ok":'))
    monkeypatch.setenv("FAKE_MODE", "ok")
    result = local.run(_cfg(tmp_path), staged={}, python=fake_python)
    assert result.returncode == 1
    assert result.reason.startswith("workers ended with different weights")
    assert result.digests == {0: "0", 1: "1"}


def test_launch_threads_do_not_leak(tmp_path, fake_python, monkeypatch):
    """The log readers the launch starts have ended when it returns.

    Threads of earlier tests in this process may end meanwhile, so the check is
    on the threads started during the run, not on the count.
    """
    monkeypatch.setenv("FAKE_MODE", "ok")
    before = set(threading.enumerate())
    local.run(_cfg(tmp_path), staged={}, python=fake_python)
    left = [t.name for t in threading.enumerate() if t not in before]
    assert left == []
