"""``PruningCallback``: a sweep trial's epochs reported to its study, and the trial
stopped at once when the study's pruner says it falls behind.

The idea of optuna-integration's ``KerasPruningCallback``, without depending on it, and
without raising through ``fit``: a pruned trial sets ``model.stop_training``, so Keras
ends the fit after this epoch's callbacks (the backup, the checkpoint, the logs stay
whole), and the callback remembers it; at the end of training it tells the study the
trial was pruned. The step reported is the epochs done (1 after the first), which is
the budget Hyperband counts.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import keras

log = logging.getLogger(__name__)


class PruningCallback(keras.callbacks.Callback):
    """Report ``monitor`` after every epoch to a sweep's trial; stop when it is pruned.

    Args:
        trial: the trial (``training.sweep.study.ask``'s handle): anything with
            ``report(value, step)``, ``should_prune()`` and ``prune()``.
        monitor: the objective, the log the sweep ranks trials by: the run's
            ``fit.early_stopping_monitor`` (``val_loss``, ``val_accuracy``, ...).
        deadline: ``time.time()`` after which the trial stops after its epoch (the
            sweep's budget, ``sweep.timeout_minutes``): not pruned, it ends as it is;
            None: no deadline.

    Example::

        handle = ask(sweep, slot)
        pruning = PruningCallback(handle, monitor=cfg.fit.early_stopping_monitor)
        model.fit(..., callbacks=[..., pruning])
        tell(handle, "pruned" if pruning.pruned else "complete")
    """

    def __init__(self, trial: Any, monitor: str, deadline: float | None = None) -> None:
        super().__init__()
        for method in ("report", "should_prune", "prune"):
            if not callable(getattr(trial, method, None)):
                raise TypeError(f"trial must have report, should_prune and prune (a handle "
                                f"from training.sweep.study.ask), got {type(trial).__name__} "
                                f"without {method}")
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"monitor must name a metric of the logs, like 'val_loss', got "
                             f"{monitor!r}")
        if deadline is not None and not (isinstance(deadline, (int, float))
                                         and math.isfinite(deadline)):
            raise ValueError(f"deadline must be a time.time() or None, got {deadline!r}")
        self.trial = trial
        self.monitor = monitor
        self.deadline = deadline
        self.pruned = False
        self.pruned_at: int | None = None  # epochs done when it was pruned
        self.out_of_time = False
        self._warned = False

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        value = (logs or {}).get(self.monitor)
        if value is None:
            if not self._warned:
                log.warning("sweep trial: the logs have no %r (they have %s): nothing "
                            "reported, nothing pruned", self.monitor,
                            ", ".join(sorted(logs or {})) or "nothing")
                self._warned = True
            return
        step = epoch + 1
        self.trial.report(float(value), step)
        if self.trial.should_prune():
            log.info("sweep trial pruned after epoch %d: %s %.6g falls behind", step,
                     self.monitor, float(value))
            self.pruned, self.pruned_at = True, step
            self.model.stop_training = True
        elif self.deadline is not None and time.time() >= self.deadline:
            log.info("sweep trial stops after epoch %d: the sweep's budget is spent", step)
            self.out_of_time = True
            self.model.stop_training = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.pruned:
            self.trial.prune()
