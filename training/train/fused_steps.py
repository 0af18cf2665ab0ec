"""Several train steps per dispatch as one compiled loop, on a split kept on the device.

Keras's JAX ``fit`` runs ``steps_per_execution`` steps as a Python loop around the
jitted step, each batch copied from the host: at the seed's batch of 64 the card mostly
waits (0.29x of what it does with the data on it, for the CIFAR CNN; docs/benchmarks.md).
``install`` replaces the model's train function, for a training split that
``training.data.device_split`` put on the device, with one jitted ``jax.lax.scan`` over
a group of batches: each step gathers its batch from the device's images by the indices
``IndexBatches`` yields and runs Keras's own stateless ``train_step``. Everything around
it is Keras's ``fit`` as before: the callbacks see every group's end and every epoch (a
SIGTERM backup lands at the end of the current group), the metrics and the optimizer's
state (the learning rate a callback changed included) travel in the state Keras hands
in and takes back, and validation reads its own batches.

An epoch's last group may hold fewer batches, or a smaller last batch: each distinct
shape is compiled once.
"""

from __future__ import annotations

import logging
from typing import Any

from training.data.device_split import DeviceSplit

log = logging.getLogger(__name__)


def install(model: Any, split: DeviceSplit) -> None:
    """Make ``model.fit`` train by groups of steps compiled as one loop over ``split``
    (the model is compiled; ``fit`` is then given the split's ``IndexBatches``)."""
    import jax
    from keras import tree
    from keras.src.distribution import distribution_lib

    def make_train_function(force: bool = False) -> None:
        if model.train_function is not None and not force:
            return
        out_shardings = None
        if distribution_lib.distribution() is not None:
            out_shardings = (None, model._get_state_sharding_spec())

        def steps(state: Any, images: Any, labels: Any, indices: Any) -> Any:
            def one(carry: Any, rows: Any) -> Any:
                logs, carry = model.train_step(carry, (images[rows], labels[rows]))
                return carry, logs

            state, logs = jax.lax.scan(one, state, indices)
            return tree.map_structure(lambda value: value[-1], logs), state

        compiled = jax.jit(steps, donate_argnums=0, out_shardings=out_shardings)

        def train_function(state: Any, iterator: Any) -> Any:
            groups = [[next(iterator)[0]]]  # StopIteration here ends the epoch (Keras)
            for _ in range(model.steps_per_execution - 1):
                try:
                    rows = next(iterator)[0]
                except StopIteration:
                    break
                if rows.shape != groups[-1][-1].shape:  # the epoch's smaller last batch
                    groups.append([])
                groups[-1].append(rows)
            for group in groups:
                logs, state = compiled(state, split.images, split.labels,
                                       jax.numpy.stack(group))
            return logs, state

        model.train_function = train_function

    model.make_train_function = make_train_function
    model.train_function = None
    # fit's symbolic build reads a batch's shapes; an index batch has none of the
    # model's: build on the split's own first example instead.
    model._symbolic_build(data_batch=(split.images[:1], split.labels[:1]))
    log.info("train steps: %d per dispatch, one compiled loop over the split on the "
             "device", model.steps_per_execution)
