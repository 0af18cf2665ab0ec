"""The sender process: where a tracked process's MLflow calls are made (``sender.py``).

``python -m training.tracking.tracking_process URI``, started by ``sender_pipe.py``:
``main`` imports MLflow, reads each call (a method name of ``MlflowTracker`` and its
arguments, length-prefixed pickles on stdin), makes them in order through
``MlflowTracker._safely``, and after each one writes a JSON line: what MLflow did not
get, whether tracking stopped, and the ``training`` log records the call made (the
tracked process logs them again, so a task's log still says why tracking stopped). Its
stdout is the answers' channel alone: anything printed goes to stderr. When the pipe
closes (the tracked process closed it, or died) the process ends after the calls it
holds.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import sys

from training.tracking.mlflow_tracker import MlflowTracker
from training.tracking.sender_pipe import HEADER


class _Records(logging.Handler):
    """The ``training`` log records of one call, handed back with its answer."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.kept: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.kept.append((record.levelno, record.getMessage()))


def main(argv: list[str]) -> int:
    os.nice(10)  # tracking takes the CPU training leaves: it never slows a night
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a stray print never reaches the answers
    records = _Records()
    logger = logging.getLogger("training")
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    tracker = MlflowTracker(argv[0])

    def answer(made: int, mark: int) -> None:
        channel.write(json.dumps({"made": made, "missed": tracker.missed_since(mark),
                                  "stopped": tracker.stopped, "records": records.kept}) + "\n")
        records.kept = []

    mark = tracker.missed_count
    tracker._safely("loading MLflow's client", tracker.connect)
    answer(0, mark)
    source = sys.stdin.buffer
    while len(head := source.read(HEADER.size)) == HEADER.size:
        what, method, args, kwargs = pickle.loads(source.read(HEADER.unpack(head)[0]))
        mark = tracker.missed_count
        tracker._safely(what, functools.partial(getattr(tracker, method), *args, **kwargs))
        answer(1, mark)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
