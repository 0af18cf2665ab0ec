"""Each epoch's scalars handed to the run's tracker, as training goes.

``EpochTracking`` gives the tracker (``training.tracking``: MLflow when tracking is on)
what Keras already put in the epoch's logs: loss, accuracy, the validation metrics, the
learning rate, and ``images_per_s`` from ``Throughput``, which runs before it. It imports
no tracking library itself. In a multi-worker run only the chief gets one (the CLI adds
it), so each epoch is logged once.

Example::

    callbacks = [Throughput(...), EpochTracking(tracker, "digits-mlp", "night-1")]
"""

from __future__ import annotations

from typing import Any

import keras


class EpochTracking(keras.callbacks.Callback):
    """Logs each epoch's numeric logs at step ``epoch`` (counted from 0).

    Args:
        tracker: what ``training.tracking.open_tracker`` returned.
        model_name: the experiment (the model's name).
        run_id: the pipeline run whose MLflow run gets the metrics.
    """

    def __init__(self, tracker: Any, model_name: str, run_id: str) -> None:
        super().__init__()
        self.tracker = tracker
        self.model_name = model_name
        self.run_id = run_id

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        values = {key: float(value) for key, value in (logs or {}).items()
                  if isinstance(value, (int, float)) or hasattr(value, "__float__")}
        self.tracker.log_metrics(self.model_name, self.run_id, values, step=epoch)
