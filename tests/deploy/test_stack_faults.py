"""Deployment: faults injected for real on the stack ``./dev stack`` started.

Each test kills a real process of the running stack (found by its command line, as a
person finds it with ``ps``) at a known point of a real run, and checks that nothing is
lost and nothing is promoted twice: the run ends, every published version re-hashes
from SeaweedFS with a plain boto3 reader, and the production pointer names only
complete versions, each promoted once. The stack starts what died again, as compose's
``restart: unless-stopped`` does.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from training.train.resume import RESTORED_MARK

pytestmark = pytest.mark.slow


def promoted_once(stack: Any) -> list[str]:
    """The versions production moved to, each once, each complete in the store."""
    history = stack.production()["history"]
    moved_to = [entry["to"] for entry in history]
    assert len(moved_to) == len(set(moved_to)), history
    for version in moved_to:
        stack.rehash(version)
    return moved_to


def test_a_killed_gpu_worker_is_retried_and_the_retry_resumes(production_stack: Any):
    """SIGKILL of the gpu worker and everything under it (its task processes and the
    training process: a lost machine) while train is between epochs. The scheduler
    notices the missing heartbeats, the retry runs on the restarted worker and resumes
    from the backup; one version is published."""
    stack = production_stack
    before = stack.versions()
    # Epochs to spare after the kill at epoch 4: under the whole suite digits trained
    # 0.3 s an epoch, and 12 had all ended before the kill landed (the test then failed
    # without the fault it is for).
    run_id = stack.trigger({"accelerator": "gpu", "force_train": True, "epochs": 60,
                            "early_stopping_patience": 60,
                            "backup_interval_s": 0})  # a backup every epoch: digits is fast
    stack.wait_task(run_id, "train", {"running"})
    stack.wait_line(stack.task_log(run_id, "train"), "Epoch 4/")
    killed = stack.kill_tree(stack.pid_of("celery worker --queues gpu"))
    assert len(killed) >= 3, killed  # the worker, its pool, the task and the training
    assert stack.wait_end(run_id, timeout=900) == "success", stack.diagnostics(run_id)
    assert stack.task(run_id, "train")["try_number"] == 2
    retry_log = stack.task_log(run_id, "train", attempt=2).read_text()
    assert RESTORED_MARK in retry_log, retry_log[-3000:]
    assert "Epoch 1/" not in retry_log  # it went on from the backup, not from scratch
    version = stack.xcom(run_id, "publish")["version"]
    assert stack.versions() - before == {version}
    stack.rehash(version)
    promoted_once(stack)
    assert "worker-gpu exited" in "\n".join(stack.lines)  # the stack started it again


def test_postgres_killed_mid_run_leaves_no_half_recorded_run(production_stack: Any):
    """SIGKILL of PostgreSQL's postmaster while train runs: the stack starts it again
    (crash recovery), and the run completes; the store and Airflow agree."""
    stack = production_stack
    before = stack.versions()
    run_id = stack.trigger({"force_train": True, "epochs": 6})
    stack.wait_task(run_id, "train", {"running"})
    stack.wait_line(stack.task_log(run_id, "train"), "Epoch 2/")
    os.kill(stack.pid_of("postgres -D"), signal.SIGKILL)
    state = stack.wait_end(run_id, timeout=900)
    assert state == "success", stack.diagnostics(run_id)
    version = stack.xcom(run_id, "publish")["version"]
    assert stack.versions() - before == {version}
    stack.rehash(version)
    promoted_once(stack)
    assert "postgres exited" in "\n".join(stack.lines)


def test_seaweedfs_killed_during_publish_leaves_production_alone(production_stack: Any):
    """SeaweedFS frozen (SIGSTOP) once evaluate has decided, so that publish's requests
    hang on it, then SIGKILLed while publish waits: production is unchanged until the
    publish that succeeds, which finds no half-written version."""
    stack = production_stack
    before, production = stack.versions(), stack.production()
    run_id = stack.trigger({"force_train": True, "epochs": 3})
    stack.wait_task(run_id, "evaluate", {"success"}, timeout=600)
    weed = stack.pid_of("weed mini")
    os.kill(weed, signal.SIGSTOP)
    try:
        stack.wait_task(run_id, "publish", {"running"})
        time.sleep(3.0)  # publish is waiting on the frozen server
    finally:
        stack.kill_tree(weed)
    assert stack.wait_end(run_id, timeout=900) == "success", stack.diagnostics(run_id)
    version = stack.xcom(run_id, "publish")["version"]
    assert stack.versions() - before == {version}
    stack.rehash(version)
    moved_to = promoted_once(stack)
    assert moved_to[:len(production["history"])] == [e["to"] for e in production["history"]]
    assert "seaweedfs exited" in "\n".join(stack.lines)
