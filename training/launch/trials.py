"""A sweep's trials as local processes: what ``python -m training run`` does with a sweep.

``run_sweep(cfg, staged)`` plans the study, trains up to ``sweep.parallel`` trials at
once, each ``python -m training train --trial-of BASE --trial N`` as a child process
(``TrainingCommand``, its lines streamed as ``[trial N] ...``), through the same
``training.steps.sweep.run_trial`` the DAG's mapped ``trial`` task calls, then picks
the best (``training.steps.sweep.pick``) and returns its config: ``run`` evaluates,
publishes and promotes that trial's run.

A trial that fails for good is recorded and the sweep goes on (the pick decides
whether too many failed). SIGTERM, SIGINT or SIGHUP to ``run`` stop every trial child
the way a task kill does (each writes its backup, its trial stays running in the
study), no further trial starts, and ``run`` exits with the stopped status: the same
command again resumes each trial under its slot.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from training.config import RunConfig
from training.data.snapshot.staging import StagedDataset
from training.errors import LaunchError
from training.launch import processes
from training.launch.command import TrainingCommand
from training.steps import sweep

log = logging.getLogger(__name__)


def run_sweep(cfg: RunConfig, staged: StagedDataset) -> RunConfig:
    """Every trial of ``cfg``'s sweep, ``sweep.parallel`` at a time; the picked trial's
    config. LaunchError (with the stopped status) when the sweep was stopped."""
    slots = sweep.plan(cfg, staged)
    running: dict[int, TrainingCommand] = {}
    stopped: list[int] = []
    lock = threading.Lock()

    def stop(signum: int) -> None:
        with lock:
            stopped.append(signum)
            for command in running.values():
                command.stop()

    with processes.scratch_dir("sweep-") as tmp:
        base = cfg.write(tmp)

        def one(slot: int) -> dict[str, Any] | None:
            def launch(trial_cfg: RunConfig, flags: Sequence[str]) -> None:
                folder = tmp / f"t{slot}"
                folder.mkdir(exist_ok=True)
                command = TrainingCommand("train", trial_cfg.write(folder), output_dir=folder,
                                          run_id=trial_cfg.run_id, staged=staged.to_dict(),
                                          flags=flags)
                with lock:
                    if stopped:
                        raise LaunchError("the sweep was stopped", 128 + stopped[0])
                    running[slot] = command
                try:
                    command.run(lambda line: print(f"[trial {slot}] {line}", file=sys.stderr,
                                                   flush=True))
                finally:
                    with lock:
                        running.pop(slot, None)

            try:
                return sweep.run_trial(cfg, staged, slot, launch, base_config=base)
            except sweep.TrialFailed as exc:
                log.warning("%s", exc)
                return None

        with processes.on_stop_signals(stop), \
                ThreadPoolExecutor(cfg.sweep.parallel, thread_name_prefix="trial") as pool:
            outcomes = list(pool.map(_resumable(one, stopped), slots))
    if stopped:
        raise LaunchError(f"the sweep of run {cfg.run_id} was stopped: run the same command "
                          "again to resume its trials", 128 + stopped[0])
    done = [o for o in outcomes if o is not None]
    log.info("sweep of run %s: %d of %d trials ended (%s)", cfg.run_id, len(done),
             len(slots), ", ".join(f"t{o['slot']} {o['state']}" for o in done) or "none")
    return sweep.pick(cfg, staged)


def _resumable(one: Any, stopped: list[int]) -> Any:
    """``one``, a trial whose child was killed kept running in the study (the same
    command again resumes it; the pick fails it with its reason if it does not run
    again): the sweep goes on, or reports a stop once."""
    def call(slot: int) -> dict[str, Any] | None:
        try:
            return one(slot)
        except LaunchError as exc:
            if not stopped:
                log.warning("trial %d: %s", slot, exc)
            return None
    return call
