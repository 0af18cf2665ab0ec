"""The sweep's winner: the best completed trial, or an error naming every failure.

A sweep goes on with its best completed trial (by the objective, in its direction; a
tie goes to the lower trial number) as long as it failed no more than
``sweep.max_failed`` times. Pruned trials stopped on purpose and skipped ones never
started (``sweep.timeout_minutes``): neither is a failure. A trial still waiting or
running at the pick did not finish: it counts as failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from training.errors import LaunchError
from training.sweep.engine import maximize
from training.sweep.record import TrialRecord, counts

SHOWN_REASON = 300  # characters of each failure's reason in the error


def pick(trials: Sequence[TrialRecord], cfg: Any) -> TrialRecord:
    """The best completed trial of ``trials`` (``study.close``'s records); LaunchError
    naming every failed trial when none completed or more than ``sweep.max_failed``
    failed."""
    failed = [t for t in trials if t.state not in ("complete", "pruned", "skipped")]
    done = [t for t in trials if t.state == "complete" and t.value is not None]
    limit = cfg.sweep.max_failed
    if not done or len(failed) > limit:
        tally = counts(trials)
        why = ("no trial completed" if not done else
               f"{len(failed)} trials failed, more than sweep.max_failed ({limit})")
        lines = [f"trial {t.number}: {t.state}: {(t.error or 'no reason recorded')[:SHOWN_REASON]}"
                 for t in failed]
        raise LaunchError(
            f"the sweep of run {cfg.run_id} has no winner: {why} ({tally['trials']} trials: "
            f"{tally['complete']} complete, {tally['pruned']} pruned, {tally['failed']} "
            f"failed, {tally['skipped']} skipped)" + "".join(f"\n  {x}" for x in lines))
    sign = -1 if maximize(cfg.fit.early_stopping_monitor) else 1
    return min(done, key=lambda t: (sign * t.value, t.number))
