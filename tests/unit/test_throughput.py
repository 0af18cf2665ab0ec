"""``callbacks.throughput``: each epoch's training images per second (timed apart from
its validation), step time and peak memory, in the epoch's logs; the run's summary."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest

from training.train.callbacks.throughput import Throughput, summary


def _fit(callback: Throughput, epochs: int = 2, validation: bool = True) -> dict:
    rng = np.random.default_rng(0)
    x, y = rng.random((96, 4)).astype("float32"), rng.integers(0, 2, 96)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0,
                        validation_data=(x[:32], y[:32]) if validation else None,
                        callbacks=[callback])
    return history.history


def test_each_epoch_logs_its_training_speed_apart_from_validation():
    # A clock read at each epoch's start and at its validation's, 10 s apart (and never
    # again at its end): the speed counts those 10 s, not the validation after them.
    ticks = itertools.chain.from_iterable((100.0 * e, 100.0 * e + 10)
                                          for e in itertools.count())
    callback = Throughput(images_per_epoch=96, batch_size=32)
    callback.clock = lambda: next(ticks)
    logs = _fit(callback)
    assert logs["images_per_s"] == pytest.approx([9.6, 9.6])  # 96 images in 10 s
    assert logs["step_ms"] == pytest.approx([10_000 / 3] * 2)  # 3 steps
    assert all(peak > 10 for peak in logs["peak_memory_mb"])  # this process's RSS, MiB


def test_without_validation_the_whole_epoch_is_training_and_steps_count_images():
    ticks = itertools.chain.from_iterable((100.0 * e, 100.0 * e + 8)
                                          for e in itertools.count())
    callback = Throughput(images_per_epoch=None, batch_size=32)
    callback.clock = lambda: next(ticks)
    logs = _fit(callback, epochs=1, validation=False)
    assert logs["images_per_s"] == pytest.approx([96 / 8])  # 3 steps x 32, over 8 s
    assert callback.memory_source == "process RSS"


def test_the_run_summary_is_the_median_epoch_and_the_peak():
    found = summary({"images_per_s": [10.0, 30.0, 20.0], "step_ms": [3.0, 1.0, 2.0],
                     "peak_memory_mb": [100.0, 300.0, 200.0]}, "process RSS",
                    {"platform": "cpu", "name": "x86_64", "count": 1})
    assert found == {"images_per_s": 20.0, "step_ms": 2.0, "peak_memory_mb": 300.0,
                     "memory_measured": "process RSS",
                     "accelerator": {"platform": "cpu", "name": "x86_64", "count": 1}}
    assert summary({}, "", None)["images_per_s"] is None


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_a_bad_count_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=f"images_per_epoch must be a positive integer, "
                                         f"got {value!r}"):
        Throughput(images_per_epoch=value, batch_size=32)
