"""What a launcher killed by SIGKILL leaves behind, for real: its scratch directory in
the system temp dir (``train-*`` of ``python -m training run --backend jax``,
``launch-*`` of the local multi-worker launcher) stays, its children get SIGTERM from
the kernel, and the next launch removes the directory, never one whose owner lives
(``training.launch.processes.scratch_dir``).

The launcher's workers are a stand-in program here (no TensorFlow); ``run --backend jax``
is the real command, training digits. SIGTERM to ``run`` itself, and the resume from the
backup it leads to, is ``tests/integration/test_resume.py``. No test measures time: a
hang guard kills what outlives it, and the test fails on what it then finds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.output import tail

from training.config import RunConfig
from training.launch import local, processes

pytestmark = pytest.mark.slow

FAKE_WORKER = """\
import os, sys, time
print("pid", os.getpid(), flush=True)
if os.environ["FAKE_MODE"] == "ok":
    sys.exit(0)
time.sleep(60)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pids_using(text: str) -> list[int]:
    """The live processes whose command line mentions ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline and _running(int(entry.name)):
                found.append(int(entry.name))
    return found


def _wait_for(condition: Callable[[], bool], what: str, guard_s: float = 120) -> None:
    """Poll ``condition``; a hang guard, not a measurement."""
    deadline = time.monotonic() + guard_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_launcher_killed_by_sigkill_leaves_its_launch_dir_and_the_next_launch_removes_it(
    tmp_path, monkeypatch
):
    scratch = tmp_path / "scratch"  # the system temp dir of both launches
    scratch.mkdir()
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\n{FAKE_WORKER}")
    fake.chmod(0o755)
    cfg = RunConfig.from_flat({"output_dir": os.fspath(tmp_path / "runs"), "workers": 2})
    driver = textwrap.dedent(f"""
        from training.config import RunConfig
        from training.launch.local import run
        run(RunConfig.from_flat({{"output_dir": {os.fspath(tmp_path / "runs")!r},
                                  "workers": 2}}), staged={{}}, python={os.fspath(fake)!r})
    """)
    launcher = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "FAKE_MODE": "sleep",
                                                "TMPDIR": os.fspath(scratch)})
    pids = []
    for line in launcher.stdout:
        if match := re.match(r"\[worker \d\] pid (\d+)", line):
            pids.append(int(match[1]))
        if len(pids) == 2:
            break
    launcher.kill()  # SIGKILL: no finally, no cleanup
    launcher.wait()
    launcher.stdout.close()
    (stale,) = scratch.glob("launch-*")
    assert (stale / "staged.json").exists() and (stale / "tmp-1").is_dir()
    # The kernel's SIGTERM (PR_SET_PDEATHSIG) ends the orphaned 60 s sleepers.
    _wait_for(lambda: not any(_running(pid) for pid in pids), "the workers outlived it")

    monkeypatch.setenv("FAKE_MODE", "ok")
    monkeypatch.setattr(tempfile, "tempdir", os.fspath(scratch))
    with processes.scratch_dir("launch-") as live:  # a launch that still runs
        result = local.run(cfg, staged={}, python=os.fspath(fake))
        assert result.returncode == 0, result.reason
        assert list(scratch.iterdir()) == [live]  # the dead one's gone, the live one kept
    assert list(scratch.iterdir()) == []


def test_a_run_killed_by_sigkill_leaves_its_train_dir_and_the_next_run_removes_it(
    staged_digits, tmp_path
):
    cfg = RunConfig.from_flat({"staging_dir": staged_digits.staging_dir,
                               "output_dir": os.fspath(tmp_path / "runs"), "run_id": "killed",
                               "store_uri": os.fspath(tmp_path / "store"), "backend": "jax",
                               "strategy": "one_device", "epochs": 2})
    config = cfg.write(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": "", "TMPDIR": os.fspath(scratch)}
    argv = [sys.executable, "-m", "training", "run", "--config", os.fspath(config)]

    def run(kill_at: str | None) -> tuple[int, list[str]]:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
        guard = threading.Timer(600, proc.kill)
        guard.start()
        lines = []
        try:
            for raw in proc.stdout:
                lines.append(raw.rstrip("\n"))
                if kill_at is not None and kill_at in lines[-1]:
                    proc.kill()  # `run` alone, as the OOM killer would
            return proc.wait(), lines
        finally:
            guard.cancel()
            proc.stdout.close()

    # Killed once its JAX child has started (the child's first log line).
    code, lines = run(kill_at="configuration valid; Keras on JAX")
    assert code == -9, tail(lines)
    (stale,) = scratch.glob("train-*")
    assert (stale / "config.json").exists()
    # The orphaned child, SIGTERMed by the kernel, ends; nothing of it reads that dir.
    _wait_for(lambda: not _pids_using(os.fspath(stale)), "the training child outlived it")

    code, lines = run(kill_at=None)
    assert code == 0, tail(lines)
    assert any(line.startswith('{"trained"') for line in lines), tail(lines)
    assert list(scratch.glob("train-*")) == []
