"""One Keras backend per process (``training.backend``), the JAX distribution's decision
(``training.train.jax_distribution``), and the JAX view of ``TF_CONFIG``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from training.errors import ConfigError
from training.train import cluster
from training.train.jax_distribution import choose_kind, mesh_shape


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    import os

    clean = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], text=True,
                          capture_output=True, env={**clean, **env}, timeout=300)


def test_a_process_whose_keras_runs_on_another_backend_refuses_naming_both():
    done = _python("""
        import keras  # TensorFlow, Keras's default
        from training import backend
        from training.errors import ConfigError
        backend.use("tensorflow")  # the same: nothing to do
        try:
            backend.use("jax")
        except ConfigError as exc:
            print(exc)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    assert "'jax'" in line and "'tensorflow'" in line and "runtime.backend" in line, line
    assert len(line.splitlines()) == 1


def test_a_jax_process_cannot_import_tensorflow_and_keras_leaves_it_alone():
    done = _python("""
        import sys
        from training import backend
        backend.use("jax")
        import keras
        keras.utils.set_random_seed(1)  # would import TensorFlow where it is installed
        print(keras.backend.backend())
        for name in ("tensorflow", "tensorflow_datasets", "tensorflow.io"):
            try:
                __import__(name)
            except ModuleNotFoundError as exc:
                print("refused", name, "training.backend" in str(exc))
        print(sorted(m for m in sys.modules if m.startswith("tensorflow")))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "jax", "refused tensorflow True", "refused tensorflow_datasets True",
        "refused tensorflow.io True", "[]"]


def test_an_unknown_backend_is_refused():
    from training import backend

    with pytest.raises(ConfigError, match="runtime.backend must be one of tensorflow, jax"):
        backend.use("torch")


@pytest.mark.parametrize(("requested", "processes", "devices", "model", "kind"), [
    ("auto", 1, 1, 1, "one_device"),
    ("auto", 1, 4, 1, "data_parallel"),
    ("auto", 1, 4, 2, "model_parallel"),
    ("one_device", 1, 4, 1, "one_device"),
    ("auto", 2, 2, 1, "multi_worker"),
    ("multi_worker", 2, 4, 2, "multi_worker"),
])
def test_the_jax_distribution_kind(requested, processes, devices, model, kind):
    assert choose_kind(requested, processes=processes, devices=devices,
                       model_parallel=model) == kind


def test_a_mesh_the_devices_do_not_fill_is_refused_naming_the_setting():
    assert mesh_shape(4, 2) == (2, 2) and mesh_shape(4, 1) == (4, 1)
    with pytest.raises(ConfigError, match=r"runtime.model_parallel is 3, but the mesh has "
                                          r"4 devices.*\[1, 2, 4\]"):
        mesh_shape(4, 3)
    with pytest.raises(ConfigError, match="runtime.model_parallel is 2, but the mesh has 1 "
                                          "device:"):
        mesh_shape(1, 2)


def test_the_coordinator_is_the_chief_from_the_same_tf_config():
    hosts = ["pod-0.job:2222", "pod-1.job:2222", "pod-2.job:2222"]
    for index in range(3):
        assert cluster.coordinator(cluster.build(hosts, index)) == (hosts[0], 3, index)
    with_chief = ('{"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, '
                  '"task": {"type": "worker", "index": 1}}')
    assert cluster.coordinator(with_chief) == ("c:1", 3, 2)
    with pytest.raises(ConfigError, match="needs TF_CONFIG"):
        cluster.coordinator(None)


def test_the_builtin_models_ship_layout_rules_and_a_model_without_is_refused():
    from training.train import models

    assert models.layout_rules("mlp") == {r"dense(_\d+)?/kernel$": ("model", None)}
    assert models.layout_rules("cnn") == models.layout_rules("mlp")
    with pytest.raises(ConfigError, match="runtime.model_parallel.*resnet50.*layout_rules"):
        models.layout_rules("resnet50")
