"""The sweep's winner: the best completed trial, or an error naming the failed trials.

A sweep goes on with its best completed trial (by the objective, in its direction; a
tie goes to the lower trial number) as long as it failed no more than
``sweep.max_failed`` times. Pruned trials stopped on purpose and skipped ones never
started (``sweep.timeout_minutes``): neither is a failure. A trial still waiting or
running at the pick did not finish: it counts as failed.

The refusal is one line, the last a command prints (and the Airflow ``train`` task's
failure): why, the counts, then each failed trial with its values and its reason, the
first ``SHOWN_FAILURES`` of them and how many more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from training.errors import SweepRefused
from training.sweep.engine import maximize
from training.sweep.record import TrialRecord, counts

SHOWN_FAILURES = 3  # failed trials named in the error; the others counted
SHOWN_REASON = 300  # characters of each failure's reason in the error


def trials_text(n: int) -> str:
    """``1 trial``, ``2 trials``."""
    return f"{n} trial" if n == 1 else f"{n} trials"


def values_text(params: Mapping[str, Any]) -> str:
    """A trial's searched values, ``fit.batch_size=64, fit.learning_rate=0.0031``."""
    def shown(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    return ", ".join(f"{path}={shown(value)}" for path, value in sorted(params.items()))


def failure_text(trial: TrialRecord) -> str:
    """``trial 3 (fit.learning_rate=0.03) failed: <its reason, on one line, cut>``."""
    reason = " ".join((trial.error or "no reason recorded").split())
    if len(reason) > SHOWN_REASON:
        reason = reason[:SHOWN_REASON].rstrip() + "..."
    values = f" ({values_text(trial.params)})" if trial.params else ""
    return f"trial {trial.number}{values} failed: {reason}"


def refusal(trials: Sequence[TrialRecord], failed: Sequence[TrialRecord], completed: int,
            cfg: Any) -> str:
    """The pick's error, one line (module doc)."""
    tally = counts(trials)
    limit = cfg.sweep.max_failed
    if not completed:
        why = f"the sweep of run {cfg.run_id} has no winner: no trial completed"
    else:
        why = (f"the sweep of run {cfg.run_id} is refused: {trials_text(len(failed))} "
               f"failed, more than sweep.max_failed ({limit}) allows")
    line = (f"{why} ({trials_text(tally['trials'])}: {tally['complete']} complete, "
            f"{tally['pruned']} pruned, {tally['failed']} failed, {tally['skipped']} "
            "skipped)")
    named = [failure_text(t) for t in failed[:SHOWN_FAILURES]]
    if len(failed) > SHOWN_FAILURES:
        more = len(failed) - SHOWN_FAILURES
        named.append(f"and {more} more failed {'trial' if more == 1 else 'trials'}")
    return "; ".join([line, *named])


def pick(trials: Sequence[TrialRecord], cfg: Any) -> TrialRecord:
    """The best completed trial of ``trials`` (``study.close``'s records); SweepRefused
    naming the failed trials when none completed or more than ``sweep.max_failed``
    failed."""
    failed = [t for t in trials if t.state not in ("complete", "pruned", "skipped")]
    done = [t for t in trials if t.state == "complete" and t.value is not None]
    if not done or len(failed) > cfg.sweep.max_failed:
        raise SweepRefused(refusal(trials, failed, len(done), cfg))
    sign = -1 if maximize(cfg.fit.early_stopping_monitor) else 1
    return min(done, key=lambda t: (sign * t.value, t.number))
