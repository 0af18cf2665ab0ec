"""Whether a triggerer runs, asked by a step just before it defers.

Airflow 3.3 lets a task defer when no triggerer runs: the task then waits, deferred, in
silence (the UI's banner "The triggerer does not appear to be running" shows on the DAGs
page, not in the task's log). So before it defers, a step asks the API server its task
process already talks to (``[core] execution_api_server_url``, whose
``/api/v2/monitor/health`` needs no login) whether the triggerer is healthy, and if it is
not, says so in the task log, with what to do. It defers all the same: a triggerer that
starts later takes the wait up. An API server that does not answer says nothing either
way, and nothing is said then.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

HEALTH_PATH = "/api/v2/monitor/health"
TIMEOUT_S = 5.0


def health_url() -> str | None:
    """``/api/v2/monitor/health`` on the API server of this task's execution API."""
    from airflow.configuration import conf

    execution = conf.get("core", "execution_api_server_url", fallback="") or ""
    base = execution.rstrip("/").removesuffix("/execution")
    return base + HEALTH_PATH if base.startswith(("http://", "https://")) else None


def no_triggerer(url: str | None) -> str | None:
    """Why no triggerer follows a deferred task now, or None (one is healthy, or the
    API server cannot tell)."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            health = json.loads(answer.read())
    except (OSError, ValueError):
        return None
    triggerer = health.get("triggerer") if isinstance(health, dict) else None
    if not isinstance(triggerer, dict) or triggerer.get("status") == "healthy":
        return None
    beat = triggerer.get("latest_triggerer_heartbeat")
    return (f"no triggerer is running: the API server reports the triggerer "
            f"{triggerer.get('status') or 'never started'} (last heartbeat: "
            f"{beat or 'none'})")


def say_if_no_triggerer(log: Any) -> str | None:
    """Log a warning when no triggerer runs (module doc); what was said."""
    reason = no_triggerer(health_url())
    if reason:
        log.warning("warning: %s. This task defers all the same and waits, holding no "
                    "worker slot, until a triggerer starts (`airflow triggerer`; ./dev "
                    "airflow, ./dev stack and the compose stack run one), or set "
                    "TRAINING_DEFERRABLE=false to follow the work in the task instead",
                    reason)
    return reason
