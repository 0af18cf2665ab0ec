"""The sweep's time budget (``sweep.timeout_minutes``), counted from its start.

The start is recorded once in the study (a study user attr ``started:<run id>``, in UTC)
by the sweep's plan, or its first ask: every trial task, on any worker, reads the same
deadline. A slot not started by then is skipped (never a failure); a trial running then
stops after its epoch (``PruningCallback(deadline=...)``). Only whether a trial starts
depends on the clock: a retried task resumes its trial whatever the time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import optuna


def started(study: optuna.Study, run_id: str) -> datetime:
    """When the sweep of ``run_id`` started, recorded the first time it is asked."""
    key = f"started:{run_id}"
    text = study.user_attrs.get(key)
    if text is None:
        text = datetime.now(UTC).isoformat(timespec="seconds")
        study.set_user_attr(key, text)
    return datetime.fromisoformat(text)


def deadline(study: optuna.Study, run_id: str, minutes: int) -> datetime | None:
    """When the budget of ``minutes`` is spent; None: no budget (0)."""
    return started(study, run_id) + timedelta(minutes=minutes) if minutes else None


def spent(study: optuna.Study, run_id: str, minutes: int) -> bool:
    end = deadline(study, run_id, minutes)
    return end is not None and datetime.now(UTC) >= end
