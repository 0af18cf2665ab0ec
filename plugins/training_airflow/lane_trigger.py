"""``LaneTrigger``: a sweep's trial task that found every lane taken waits in the
triggerer, holding no worker slot, until one of the sweep's trials ends.

A trial claims a lane only while fewer than ``sweep.parallel`` of its sweep's trials
train (``training.sweep.slots.claim_lane``). Without deferral a trial task that finds
every lane taken sleeps on its worker slot and looks again; deferred
(``TRAINING_DEFERRABLE``), it hands that wait here (``sweep_tasks.TrialOperator``). The
trigger looks at the study every ``poll_interval`` seconds, each look in a thread
(``asyncio.to_thread``: the Optuna storage, SQLite or PostgreSQL, is read with its own
blocking driver), says every minute that the trial still waits, and fires once a lane is
free. The task then resumes and claims its lane in the study as a task that never
deferred does; if another trial took it first, it defers again. It waits for any trial
to end, never for a given one, as before.

The study's database password, if it needs one, comes from
``TRAINING_SWEEP_STORAGE_PASSWORD`` in the triggerer's environment (docs/sweeps.md), never
from the trigger's arguments, which Airflow stores in its database.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

CLASSPATH = "training_airflow.lane_trigger.LaneTrigger"
LANE_EVENT = "lane"
STILL_WAITING_EVERY_S = 60.0


def open_study(url: str, study_name: str) -> tuple[Any, Any]:
    """The Optuna storage at ``url`` (its password from this process's environment) and
    the study ``study_name`` in it; blocking (call it in a thread)."""
    import optuna

    from training.deployment import sweep_password_from_env
    from training.sweep.storage import open_storage

    storage = open_storage(url, sweep_password_from_env())
    return storage, optuna.load_study(study_name=study_name, storage=storage)


class LaneTrigger(BaseTrigger):
    """Fires when fewer than ``lanes`` trials of sweep ``run_id`` train in study
    ``study_name`` at ``storage`` (a SQLAlchemy URL without a password); ``slot`` is the
    waiting trial's, for the log."""

    def __init__(self, *, storage: str, study_name: str, run_id: str, lanes: int, slot: int,
                 poll_interval: float) -> None:
        super().__init__()
        self.storage, self.study_name, self.run_id = storage, study_name, run_id
        self.lanes, self.slot, self.poll_interval = lanes, slot, poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"storage": self.storage, "study_name": self.study_name,
                           "run_id": self.run_id, "lanes": self.lanes, "slot": self.slot,
                           "poll_interval": self.poll_interval}

    def _open(self) -> Any:
        return open_study(self.storage, self.study_name)[1]

    def _free(self, study: Any) -> bool:
        from training.sweep.slots import lanes_free

        return lanes_free(study, self.run_id, self.lanes)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from training.sweep.storage import shown_storage

        self.log.info("trial %d waits in the triggerer for one of the %d trials training to "
                      "end (sweep.parallel), holding no worker slot; study %s in %s",
                      self.slot, self.lanes, self.study_name, shown_storage(self.storage))
        study = await asyncio.to_thread(self._open)
        since = said = time.monotonic()
        while not await asyncio.to_thread(self._free, study):
            if time.monotonic() - said >= STILL_WAITING_EVERY_S:
                said = time.monotonic()
                self.log.info("trial %d still waits for a lane, for %d s", self.slot,
                              int(said - since))
            await asyncio.sleep(self.poll_interval)
        self.log.info("a lane is free: trial %d resumes to claim it", self.slot)
        yield TriggerEvent({"kind": LANE_EVENT, "slot": self.slot})
