"""What each step of a DAG run did and how long it took, written where the run lives.

Every step of the DAG (``tasks.py``) writes one record when it ends, succeeded, skipped
or failed: ``<run_dir>/airflow/<task_id>.json`` (``layout.AIRFLOW_RECORDS``), with its
result (the XCom) or its reason, the DAG's graph (each task's downstream tasks: the
states of tasks that never ran follow from it), its timing, and which of TensorFlow,
tfds and Keras its process had loaded (none, by design: ``heavy_modules``). Nothing here
imports Airflow, so ``python -m tools.summary`` (the end of ``./dev demo``)
reads a run back in a fraction of a second instead of starting Airflow to query its
database.

The timing, logged as the first line of every task's log and again, complete, as its
last::

    timing: queued 0.4 s, started 2.1 s, imports 0.3 s, work 1.2 s

- queued: from the moment the task could run (its upstream tasks' records ended, or
  the DAG run started) to the task instance's start: the executor's queue;
- started: from the task instance's start to the operator's ``execute``: the task
  process, the DAG file's parse, the context;
- imports: the step's library modules (``Step.imports`` in ``tasks.py``);
- work: the step itself, child processes included.

Airflow's task processes do not know when the task was queued; the upstream records
are the nearest thing this side of the metadata database, so "queued" also counts the
scheduler's loop. The first line cannot hold ``work`` yet: it says ``work follows``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training.layout import AIRFLOW_RECORDS

# What no task process should have loaded: its record says which it had (in a process
# of its own, ``./dev airflow``'s, that is what the step loaded; ``airflow dags test``
# runs every task in one process).
HEAVY = ("tensorflow", "tensorflow_datasets", "keras")


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else max(0.0, (end - start).total_seconds())


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _shown(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.1f} s"


@dataclass
class Timing:
    queued: float | None
    started: float | None
    imports: float
    work: float | None = None
    began: datetime = field(default_factory=lambda: datetime.now(UTC))

    def line(self) -> str:
        return (f"timing: queued {_shown(self.queued)}, started {_shown(self.started)}, "
                f"imports {self.imports:.1f} s, "
                + ("work follows" if self.work is None else f"work {self.work:.1f} s"))

    def finish(self) -> None:
        self.work = _seconds(self.began, datetime.now(UTC))

    def to_dict(self) -> dict[str, Any]:
        return {"queued_s": _round(self.queued), "started_s": _round(self.started),
                "imports_s": round(self.imports, 3),
                "work_s": _round(self.work)}


def _when(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None


def timing(run_dir: Path, ti: Any, dag_run: Any, upstream: set[str], execute_at: datetime,
           imports: float) -> Timing:
    """The step's timing so far: ``execute_at`` is when ``execute`` was entered."""
    ready = [_when(r.get("ended")) for r in read_run(run_dir).values()
             if r.get("task_id") in upstream]
    ready = [r for r in ready if r is not None]
    could_run = max(ready) if ready else getattr(dag_run, "start_date", None)
    start = getattr(ti, "start_date", None)
    return Timing(queued=_seconds(could_run, start), started=_seconds(start, execute_at),
                  imports=imports)


def write(run_dir: Path, ti: Any, dag_run: Any, graph: dict[str, list[str]], state: str,
          value: Any, timed: Timing) -> None:
    """The step's record, written whole (a temporary file, then renamed)."""
    folder = Path(run_dir) / AIRFLOW_RECORDS
    folder.mkdir(parents=True, exist_ok=True)
    mapped = getattr(ti, "map_index", -1)
    mapped = mapped if isinstance(mapped, int) and mapped >= 0 else None
    record = {"task_id": ti.task_id, "map_index": mapped, "dag_id": ti.dag_id,
              "airflow_run_id": ti.run_id,
              "run_after": dag_run.run_after.isoformat(), "try_number": ti.try_number,
              "state": state, "value": value, "graph": graph,
              "ended": datetime.now(UTC).isoformat(), "timing": timed.to_dict(),
              "heavy_modules": sorted(m for m in HEAVY if m in sys.modules)}
    path = folder / f"{key(record)}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_run(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The records of one run directory, by task id (unreadable ones left out)."""
    records = {}
    for path in sorted((Path(run_dir) / AIRFLOW_RECORDS).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and "task_id" in record:
            records[key(record)] = record
    return records


def key(record: dict[str, Any]) -> str:
    """A record's name: its task id, and a mapped instance's index (``trial[2]``)."""
    index = record.get("map_index")
    return record["task_id"] if index is None else f"{record['task_id']}[{index}]"


def latest_run(output_dir: Path, dag_id: str) -> dict[str, dict[str, Any]] | None:
    """The records of ``dag_id``'s latest run (by the DAG run's ``run_after``) under
    ``output_dir``; None when no run of it has left any."""
    best, best_key = None, None
    for folder in Path(output_dir).glob(f"*/{AIRFLOW_RECORDS}"):
        records = {k: r for k, r in read_run(folder.parent).items() if r.get("dag_id") == dag_id}
        if not records:
            continue
        newest = max((r.get("run_after", ""), r.get("ended", "")) for r in records.values())
        if best_key is None or newest > best_key:
            best, best_key = records, newest
    return best


def task_states(records: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Every task of the run (the DAG's graph is in each record) and its state: a
    recorded one's own; a mapped one's, its instances' worst; one that never ran is
    ``upstream_failed`` below a failed task, ``skipped`` below a skipped one (Airflow's
    default trigger rule) or below a step that returned an empty list (a mapped task
    over nothing: a run without a sweep's ``trial``), else ``not run``."""
    graph: dict[str, list[str]] = {}
    for record in records.values():
        graph.update(record.get("graph", {}))
    states = {task: record["state"] for task, record in records.items()}
    for task in graph:  # a mapped task: its instances' worst state
        instances = {r["state"] for r in records.values()
                     if r["task_id"] == task and r.get("map_index") is not None}
        if instances:
            states[task] = next((s for s in ("failed", "skipped") if s in instances),
                                "success")
    for _ in graph:  # enough passes for the longest chain
        for task in graph:
            if task in states:
                continue
            ups = [up for up, downs in graph.items() if task in downs]
            above = {states.get(up, "not run") for up in ups}
            nothing = any(records.get(up, {}).get("value") == [] for up in ups)
            states[task] = ("upstream_failed" if above & {"failed", "upstream_failed"} else
                            "skipped" if "skipped" in above or nothing else "not run")
    return states
