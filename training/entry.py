"""The one wrapper every ``python -m training...`` entry point runs its work in.

``training.cli`` (the pipeline's commands), ``training.launch.local`` (the local
multi-worker launcher), ``training.launch.worker`` (one worker) and
``training.launch.kubernetes`` (the pod's exec wrapper) all exit through ``run_command``,
so every command line fails the same way: one ``error:`` line and a status that says
what kind of failure it was. Here, not in ``cli``, so that launchers need not import the
CLI (which imports them).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from training.errors import CONFIG_ERROR_EXIT, ERROR_EXIT, ConfigError, TrainingError, shown

log = logging.getLogger("training")


def run_command(command: Callable[[], int]) -> int:
    """Run a command line's work: logging to stderr, and a project error as one
    ``error:`` line with exit status 2 (bad configuration) or 1 (anything else).
    Every ``python -m training...`` entry point goes through here."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return command()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    except TrainingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_status", ERROR_EXIT)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a failure no check foresaw: still one line, and the trace
        log.debug("unexpected failure", exc_info=True)
        if os.environ.get("TRAINING_TRACEBACK"):
            import traceback

            traceback.print_exc()
        print(f"error: unexpected {type(exc).__name__}: {shown(exc)} (set "
              "TRAINING_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return ERROR_EXIT
