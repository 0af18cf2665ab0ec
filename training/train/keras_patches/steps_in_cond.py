"""``spe_collectives_in_cond``: Keras 3's ``steps_per_execution > 1`` loop under MirroredStrategy
and MultiWorkerMirroredStrategy.

``multi_step_on_iterator`` failure
    With tensorflow 2.21 / keras 3.15, ``model.fit(...)`` compiled with
    ``steps_per_execution=N`` (N > 1) under a strategy whose gradient all-reduce uses
    collective ops (MirroredStrategy with more than one device, MultiWorkerMirroredStrategy)
    fails on its first call with ``InvalidArgumentError: You must feed a value for
    placeholder tensor 'while/body/_N/while/cond/then/_M/while/cond/Placeholder' with dtype
    int32``.

    Why: ``TensorFlowTrainer._make_function`` (keras/src/backend/tensorflow/trainer.py)
    runs the N steps in a ``tf.while_loop`` whose body calls the *tf.function*
    ``one_step_on_data`` inside a ``tf.cond`` (``inner_body``: ``tf.cond(...,
    has_next, no_has_next)``, trainer.py:182, the call at :171). Every collective
    all-reduce in that step takes its instance key as a *call-time capture*
    (``FuncGraph.capture_call_time_value``, tensorflow/python/distribute/
    cross_device_utils.py:332). When a tf.function with call-time captures is called
    while another graph is being built, its captures are re-registered as call-time
    captures of the current default graph (func_graph.py:376-386), here the cond branch
    graph. ``cond_v2`` threads only a branch's ordinary captures into the ``If`` op
    (cond_v2.py:106-114, ``true_graph.external_captures``), never its deferred ones
    (``while_v2`` does, while_v2.py:215-233), so the branch keeps an unfed Placeholder:
    one per all-reduce. ``steps_per_execution=1`` takes another path with no tf.cond
    (trainer.py:152-155), and without collectives (one device) there is no call-time
    capture, so both work. Keras introduced the while_loop/cond in keras-team/keras#20396
    (Keras 3.7, ``get_next_as_optional``) and #20451 (``unrolled_steps_per_execution``).

    The patch: the same loop, but the first step of every while-loop iteration is called
    unconditionally: the loop's own condition already guarantees ``execution_step <
    steps_per_execution`` and ``next_optional_inputs.has_value()``, so upstream's tf.cond
    around it always took its true branch. A tf.function called in a while body is fine
    (while_v2 hoists its call-time captures). Only when ``unrolled_steps_per_execution > 1``
    do the 2nd..k-th unrolled steps still need a tf.cond; there the step is called as a
    plain Python function (inlined, no nested tf.function), so the collective's
    ``_next_instance_key`` itself walks out of the control-flow graphs
    (cross_device_utils.py:323-325) and captures in the enclosing tf.function. Everything
    else (iterator advance, Optional outputs, reduction, the eager ``function`` wrapper)
    is Keras 3.15.1's code.

Applied only to models compiled under a tf.distribute strategy with more than one replica
and not run eagerly: anything else goes to Keras's own ``_make_function``. ``probe()``
traces the installed Keras's loop (no data, no devices, ~0.1 s) with a stand-in step that
holds a call-time capture and reports the unfed placeholder it leaves. Tracing v2 control
flow initialises the TensorFlow runtime, so call it once the strategy exists, never before
MultiWorkerMirroredStrategy is created. ``needed_end_to_end()`` runs a real 2-device
MirroredStrategy fit, unpatched, in a fresh interpreter (~30 s).

``keras_patches.install_for(strategy)`` installs it for every strategy with more than
one replica except TPUStrategy (not tried on a TPU: ``strategy.steps_per_execution``
keeps 1 there), unless ``TRAINING_KERAS_COMPAT`` is ``off`` or names it after
``without:``; ``tests/unit/test_keras_patches.py`` fails, naming it, once ``probe()``
says Keras no longer needs it. Verified here: with it, 2 epochs at 10, 4, 16 and 3 (2
unrolled) steps per execution end with bit-identical weights, logs and evaluation to 1
step, under
MirroredStrategy over 2 CPU devices and an in-process 2-device MultiWorkerMirroredStrategy.

Why a module of about 300 lines: the replacement mirrors Keras's function whole (it
cannot be patched in part), and its probes belong next to it.
"""

from __future__ import annotations

from typing import Any

from training.train.keras_patches.patch import REPLICATED, Patch, original, trainer_module

NAME = "spe_collectives_in_cond"
ISSUE = ("keras multi_step_on_iterator calls the step tf.function inside tf.cond; cond_v2 "
         "drops call-time captures (collective instance keys); loop from keras-team/keras#20396")


def _target() -> tuple[Any, str]:
    return trainer_module().TensorFlowTrainer, "_make_function"


def make_function(self: Any, step_function: Any) -> Any:
    # Mirrors TensorFlowTrainer._make_function (keras 3.15.1) except multi_step_on_iterator.
    # One replica (no strategy, OneDevice, a 1-device MWMS worker): no collectives, no
    # call-time captures, Keras's own loop works.
    strategy = self._distribute_strategy
    if strategy is None or self.run_eagerly or strategy.num_replicas_in_sync == 1:
        return original(*_target())(self, step_function)

    import tensorflow as tf

    trainer = trainer_module()

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data_py(data):
        """Runs a single training step on a batch of data."""
        outputs = self.distribute_strategy.run(step_function, args=(data,))
        # Looked up at call time: picks up a patched reduce_per_replica.
        outputs = trainer.reduce_per_replica(
            outputs, self.distribute_strategy, reduction="auto")
        return outputs

    one_step_on_data = tf.function(
        one_step_on_data_py, reduce_retracing=True, jit_compile=self.jit_compile)
    one_step_on_data = self._autoconvert_optionals(one_step_on_data)
    # For steps that must sit inside a tf.cond: no nested tf.function (see module doc).
    one_step_on_data_inline = self._autoconvert_optionals(one_step_on_data_py)

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_iterator(iterator):
        steps = self.steps_per_execution
        if steps == 1:
            return tf.experimental.Optional.from_value(
                one_step_on_data(iterator.get_next()))

        # the spec is set lazily during the tracing of `tf.while_loop`
        empty_outputs = tf.experimental.Optional.empty(None)

        def cond(execution_step, optional_outputs, next_optional_inputs):
            return tf.logical_and(
                tf.less(execution_step, steps), next_optional_inputs.has_value())

        def advance(execution_step, next_optional_inputs):
            # We don't want to iterate if we have reached `steps_per_execution` steps.
            return tf.cond(
                tf.less(execution_step + 1, steps),
                lambda: iterator.get_next_as_optional(),
                lambda: next_optional_inputs,
            )

        def first_step(execution_step, optional_outputs, next_optional_inputs):
            # `cond` holds here: a step and an input exist; no tf.cond needed.
            next_optional_outputs = tf.experimental.Optional.from_value(
                one_step_on_data(next_optional_inputs.get_value()))
            empty_outputs._element_spec = next_optional_outputs.element_spec
            return (execution_step + 1, next_optional_outputs,
                    advance(execution_step, next_optional_inputs))

        def conditional_step(execution_step, optional_outputs, next_optional_inputs):
            def has_next():
                next_optional_outputs = tf.experimental.Optional.from_value(
                    one_step_on_data_inline(next_optional_inputs.get_value()))
                empty_outputs._element_spec = next_optional_outputs.element_spec
                return next_optional_outputs

            def no_has_next():
                optional_outputs._element_spec = empty_outputs._element_spec
                return optional_outputs

            next_optional_outputs = tf.cond(
                tf.logical_and(tf.less(execution_step, steps),
                               next_optional_inputs.has_value()),
                has_next, no_has_next)
            return (execution_step + 1, next_optional_outputs,
                    advance(execution_step, next_optional_inputs))

        def body(execution_step, optional_outputs, next_optional_inputs):
            state = first_step(execution_step, optional_outputs, next_optional_inputs)
            for _ in range(min(self.unrolled_steps_per_execution, steps) - 1):
                state = conditional_step(*state)
            return state

        execution_step = tf.constant(0)
        next_optional_inputs = iterator.get_next_as_optional()
        _, final_optional_outputs, _ = tf.while_loop(
            cond, body,
            loop_vars=[execution_step, empty_outputs, next_optional_inputs])
        final_optional_outputs._element_spec = empty_outputs.element_spec
        return final_optional_outputs

    multi_step_on_iterator = tf.function(multi_step_on_iterator, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            opt_outputs = multi_step_on_iterator(iterator)
            if not opt_outputs.has_value():
                raise StopIteration
            return opt_outputs.get_value()
        for _, data in zip(range(self.steps_per_execution), iterator, strict=False):
            outputs = one_step_on_data(data)
        return outputs

    return function


# --- probe -------------------------------------------------------------------------------

def _unfed_placeholders(make_function: Any) -> list[str]:
    """Trace ``make_function``'s multi-step loop (steps_per_execution=2) around a stand-in
    step holding a call-time capture, as every collective all-reduce's instance key is
    (cross_device_utils.py:332); return the unfed Placeholders in the traced functions.

    Graph-building only (no data, no devices), but tracing initialises the TensorFlow
    runtime: call it after the strategy has been created."""
    import tensorflow as tf
    from tensorflow.python.framework import ops

    trainer = trainer_module()

    class _TwoReplicas:  # what _make_function may ask of the model's own strategy
        num_replicas_in_sync = 2

    class _StandIn:
        _distribute_strategy = _TwoReplicas()
        distribute_strategy = tf.distribute.get_strategy()  # runs/reduces: the default one
        run_eagerly = False
        jit_compile = False
        steps_per_execution = 2
        unrolled_steps_per_execution = 1
        _autoconvert_optionals = trainer.TensorFlowTrainer._autoconvert_optionals

    def step(data):
        key = ops.get_default_graph().capture_call_time_value(
            lambda: tf.constant(0), tf.TensorSpec([], tf.int32))
        return {"loss": tf.reduce_sum(data) + tf.cast(key, tf.float32)}

    function = make_function(_StandIn(), step)
    multi_step = next(
        cell.cell_contents for cell in function.__closure__
        if getattr(getattr(cell.cell_contents, "python_function", None), "__name__", "")
        == "multi_step_on_iterator")
    spec = tf.data.IteratorSpec(tf.TensorSpec([None], tf.float32))
    concrete = multi_step.get_concrete_function(spec)
    library = concrete.graph.as_graph_def().library
    return [f"{fdef.signature.name}/{node.name}" for fdef in library.function
            for node in fdef.node_def if node.op == "Placeholder"]


def probe() -> str | None:
    """Evidence that the installed Keras still fails (a string), or None when it doesn't:
    the unpatched ``TensorFlowTrainer._make_function`` traced around a stand-in step."""
    unfed = _unfed_placeholders(original(*_target()))
    if unfed:
        return (f"TensorFlowTrainer._make_function leaves {len(unfed)} call-time capture(s) "
                f"unfed inside its steps_per_execution loop ({', '.join(unfed)}) [{ISSUE}]")
    return None


_END_TO_END = r"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np, keras
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=2)
try:
    model.fit(np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32"), batch_size=4,
              epochs=1, verbose=0)
except tf.errors.InvalidArgumentError as exc:
    lines = [ln.strip() for ln in str(exc).splitlines() if "must feed a value" in ln]
    print("FAILS", (lines or [type(exc).__name__])[0][:300])
else:
    print("WORKS")
"""


def needed_end_to_end(python: str | None = None, timeout: float = 300) -> str | None:
    """The definitive check: a 2-step-per-execution fit under a 2-CPU MirroredStrategy,
    unpatched, in a fresh interpreter (~30 s). Evidence string, or None when it works."""
    import subprocess
    import sys

    proc = subprocess.run([python or sys.executable, "-c", _END_TO_END], check=False,
                          capture_output=True,
                          text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILS", "WORKS"))]
    if proc.returncode != 0 or not lines:
        return f"end-to-end probe failed (rc {proc.returncode}): {proc.stderr[-500:]}"
    return None if lines[-1] == "WORKS" else lines[-1]


PATCH = Patch(NAME, ISSUE, REPLICATED, _target, make_function, probe,
              probe_after_strategy=True)
