"""Several train steps per dispatch on a split kept on the device, in a form per platform.

Keras's JAX ``fit`` runs ``steps_per_execution`` steps as a Python loop around the
jitted step, each batch copied from the host: at the seed's batch of 64 the card mostly
waits (0.29x of what it does with the data on it, for the CIFAR CNN; docs/benchmarks.md).
``install`` replaces the model's train function, for a training split that
``training.data.input.device_split`` put on the device, with a group function over a group of
batches: each step gathers its batch from the device's images by the indices
``IndexBatches`` yields and runs Keras's own stateless ``train_step``. Everything around
it is Keras's ``fit`` as before: the callbacks see every group's end and every epoch (a
SIGTERM backup lands at the end of the current group), the metrics and the optimizer's
state (the learning rate a callback changed included) travel in the state Keras hands
in and takes back, and validation reads its own batches.

The loop's form depends on the platform the split lives on (``loop_form``, measured:
docs/backends.md). On a GPU or TPU, one jitted ``jax.lax.scan`` per group keeps the card
busy. On a CPU, XLA runs a convolution inside a compiled loop's body far slower than
outside it (the seed CNN's bare steps: 14 img/s against 310), so there the scan is
unrolled: one program per group, no loop in it.

An epoch's last group may hold fewer batches, or a smaller last batch: each distinct
shape is compiled once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from training.data.input.device_split import DeviceSplit

log = logging.getLogger(__name__)

FORMS = {  # form -> what the log says it is
    "rolled": "one compiled loop (jax.lax.scan) per group",
    "unrolled": "one compiled program per group, its steps unrolled (jax.lax.scan, "
                "unroll=True)",
    "step": "one dispatch per step",
}
# Measured with bench/accelerator.py's loop forms (docs/backends.md).
CPU_WHY = ("on a CPU, XLA runs a convolution inside a compiled loop far slower: the "
           "seed CNN's bare steps ran at 14 img/s rolled, 310 unrolled on 2 cores")
ACCELERATOR_WHY = ("on an accelerator, one compiled loop per group keeps it busy "
                   "(0.98x of its ceiling on an H200, issue 40)")


def loop_form(platform: str) -> tuple[str, str]:
    """The loop form for a split on ``platform``'s devices, and why (logged)."""
    if platform == "cpu":
        return "unrolled", CPU_WHY
    return "rolled", ACCELERATOR_WHY


def group_function(model: Any, form: str) -> Callable[..., Any]:
    """``run(state, images, labels, group) -> (logs, state)``: Keras's stateless
    ``train_step`` over ``group`` (a list of index batches of one shape) in ``form``;
    the logs are the last step's."""
    import jax
    from keras import tree
    from keras.src.distribution import distribution_lib

    if form not in FORMS:
        raise ValueError(f"loop form must be one of {', '.join(FORMS)}, got {form!r}")
    out_shardings = None
    if distribution_lib.distribution() is not None:
        out_shardings = (None, model._get_state_sharding_spec())

    if form == "step":
        def step(state: Any, images: Any, labels: Any, rows: Any) -> Any:
            return model.train_step(state, (images[rows], labels[rows]))

        compiled_step = jax.jit(step, donate_argnums=0, out_shardings=out_shardings)

        def run_steps(state: Any, images: Any, labels: Any, group: list[Any]) -> Any:
            for rows in group:
                logs, state = compiled_step(state, images, labels, rows)
            return logs, state

        return run_steps

    def steps(state: Any, images: Any, labels: Any, indices: Any) -> Any:
        def one(carry: Any, rows: Any) -> Any:
            logs, carry = model.train_step(carry, (images[rows], labels[rows]))
            return carry, logs

        state, logs = jax.lax.scan(one, state, indices, unroll=form == "unrolled")
        return tree.map_structure(lambda value: value[-1], logs), state

    compiled = jax.jit(steps, donate_argnums=0, out_shardings=out_shardings)

    def run_group(state: Any, images: Any, labels: Any, group: list[Any]) -> Any:
        stack = np.stack if isinstance(group[0], np.ndarray) else jax.numpy.stack
        return compiled(state, images, labels, stack(group))

    run_group.compiled = compiled  # its program, for a look at what XLA gets
    return run_group


def install(model: Any, split: DeviceSplit, form: str | None = None) -> dict[str, str]:
    """Make ``model.fit`` train by groups of steps, each group gathered on the device
    from ``split`` and run in ``form`` (default: ``loop_form`` of the split's platform);
    the model is compiled; ``fit`` is then given the split's ``IndexBatches``. Returns
    what ran and why (``{"form", "platform", "why"}``) for the run's record."""
    import jax
    from keras.src.distribution import distribution_lib

    platform = split.platform  # where the split lives: cpu, gpu, tpu
    chosen, why = loop_form(platform)
    if form is not None and form != chosen:
        chosen, why = form, f"asked for {form!r}"

    def make_train_function(force: bool = False) -> None:
        if model.train_function is not None and not force:
            return
        run = group_function(model, chosen)
        place = (model._get_state_sharding_spec()
                 if distribution_lib.distribution() is not None else split.images.sharding)

        def train_function(state: Any, iterator: Any) -> Any:
            # Keras hands in new, uncommitted arrays at the first group and at each
            # epoch's start (the metrics reset): a program is compiled per placement of
            # its arguments, so each would compile again (16 s for the CNN unrolled on
            # 2 cores). Placed where the loop leaves them, they compile once.
            if not all(getattr(leaf, "committed", True) for leaf in jax.tree.leaves(state)):
                state = jax.device_put(state, place)
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
                logs, state = run(state, split.images, split.labels, group)
            return logs, state

        model.train_function = train_function

    model.make_train_function = make_train_function
    model.train_function = None
    # fit's symbolic build reads a batch's shapes; an index batch has none of the
    # model's: build on the split's own first example instead.
    model._symbolic_build(data_batch=(split.images[:1], split.labels[:1]))
    log.info("train steps: %d per group, %s, the split on the %s device (%s)",
             model.steps_per_execution, FORMS[chosen], platform, why)
    return {"form": chosen, "platform": platform, "why": why}
