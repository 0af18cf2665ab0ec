"""``FineTuning``: train the head on a frozen backbone, then fine-tune its top layers.

For ``model.freeze_epochs`` epochs the model's ``backbone`` layer is frozen (its
BatchNormalization layers run in inference mode); from then on its top
``unfreeze_layers`` layers train (0: all of them), BatchNormalization layers excepted,
as in the Keras transfer-learning guide, and the learning rate is multiplied by
``lr_factor`` once.

Keras 3 fixes the trainable variables when it traces the train step, so a change of the
flags retraces it (``make_train_function(force=True)``). The optimizer is built on every
variable before any is frozen: an optimizer built on the head alone refuses the
backbone's variables later ("Unknown variable").

Resume after preemption (``training.train.callbacks.backup``): the flags follow the
epoch, set in ``on_epoch_begin``, so a resumed run has them as an uninterrupted one had.
The learning rate is lowered in ``on_epoch_end`` of the last frozen epoch, after
ReduceLROnPlateau and before ``ResumableBackup`` (the order in ``fit.make_callbacks``),
so every backup holds the rate that belongs to its epoch and a resumed run never lowers
it twice. A backup taken inside an epoch resumes that epoch from its start, before the
change. When training ends the flags are put back as the model was built, so the saved
model's trainable variables are the ones its optimizer state belongs to.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import keras

from training.errors import ConfigError, shown

log = logging.getLogger(__name__)

FROZEN, FINE_TUNING = "frozen", "fine-tuning"


class FineTuning(keras.callbacks.Callback):
    """Freeze ``backbone`` for ``freeze_epochs`` epochs, then unfreeze its top
    ``unfreeze_layers`` layers (0: all) with the learning rate times ``lr_factor``."""

    def __init__(self, backbone: keras.layers.Layer, *, freeze_epochs: int,
                 unfreeze_layers: int = 0, lr_factor: float = 0.1) -> None:
        super().__init__()
        if not isinstance(backbone, keras.layers.Layer):
            raise ConfigError(f"backbone must be a Keras layer, got {shown(backbone)}")
        for name, value, low in (("freeze_epochs", freeze_epochs, 1),
                                 ("unfreeze_layers", unfreeze_layers, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {shown(value)}")
        if isinstance(lr_factor, bool) or not isinstance(lr_factor, int | float) \
                or not 0 < lr_factor <= 1:
            raise ConfigError(f"lr_factor must be a number greater than 0 and at most 1, "
                              f"got {shown(lr_factor)}")
        self.backbone = backbone
        self.freeze_epochs = freeze_epochs
        self.unfreeze_layers = unfreeze_layers
        self.lr_factor = float(lr_factor)
        self.phase: str | None = None  # what the flags are set to now
        self._as_built: list[tuple[Any, bool]] = []

    def tuned_layers(self) -> list[keras.layers.Layer]:
        """The backbone's layers that train after ``freeze_epochs``."""
        layers = self.backbone.layers
        top = layers[-self.unfreeze_layers:] if self.unfreeze_layers else layers
        return [layer for layer in top
                if not isinstance(layer, keras.layers.BatchNormalization)]

    def set_phase(self, phase: str) -> None:
        """Set the trainable flags for ``phase`` (FROZEN or FINE_TUNING)."""
        self.backbone.trainable = phase == FINE_TUNING  # every layer in it, recursively
        if phase == FINE_TUNING:
            tuned = {id(layer) for layer in self.tuned_layers()}
            for layer in self.backbone.layers:
                layer.trainable = id(layer) in tuned
        self.phase = phase

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer = self.model.optimizer
        if not optimizer.built:  # on every variable, before any is frozen
            optimizer.build(self.model.trainable_variables)
        self.phase = None
        self._as_built = [(layer, layer.trainable)
                          for layer in (self.backbone, *self.backbone.layers)]

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        # The stored model is the one built: its trainable variables are those the
        # optimizer was built on, so it loads with its optimizer state.
        for layer, trainable in self._as_built:
            layer.trainable = trainable

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        phase = FROZEN if epoch < self.freeze_epochs else FINE_TUNING
        if phase == self.phase:
            return
        self.set_phase(phase)
        self.model.make_train_function(force=True)  # trace with the new trainable set
        trainable = sum(math.prod(v.shape) for v in self.backbone.trainable_variables)
        log.info("epoch %d: backbone %s (%d of its layers train, %d weights)", epoch + 1,
                 phase, len(self.tuned_layers()) if phase == FINE_TUNING else 0, trainable)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch + 1 != self.freeze_epochs:
            return
        optimizer = self.model.optimizer
        rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        optimizer.learning_rate = rate * self.lr_factor
        log.info("end of epoch %d: the backbone unfreezes next epoch; learning rate "
                 "%.3g -> %.3g", epoch + 1, rate, rate * self.lr_factor)
