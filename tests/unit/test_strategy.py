import itertools
import math

import pytest

from training.config import RunConfig, RuntimeConfig
from training.errors import ConfigError
from training.train import strategy as st


@pytest.mark.parametrize(
    ("requested", "tpu", "workers", "gpus", "expected"),
    [
        ("auto", True, 4, 8, "tpu"),
        ("auto", False, 2, 8, "multi_worker"),
        ("auto", False, 1, 2, "mirrored"),
        ("auto", False, 0, 1, "one_device"),
        ("auto", False, 0, 0, "one_device"),
        ("mirrored", False, 0, 0, "mirrored"),
        ("one_device", True, 4, 8, "one_device"),
        ("multi_worker", False, 0, 0, "multi_worker"),
        ("tpu", False, 0, 0, "tpu"),
    ],
)
def test_choose_kind(requested, tpu, workers, gpus, expected):
    assert st.choose_kind(requested, tpu_available=tpu, workers_in_tf_config=workers,
                          gpus=gpus) == expected


def test_choose_kind_rejects_unknown():
    with pytest.raises(ConfigError, match="runtime.strategy must be one of auto, one_device"):
        st.choose_kind("parameter_server", tpu_available=False, workers_in_tf_config=0, gpus=0)


def test_a_damaged_tf_config_is_refused_before_any_strategy(monkeypatch):
    """TF_CONFIG is read through training.train.cluster (tests/unit/test_cluster.py)."""
    monkeypatch.setenv("TF_CONFIG", "{nope")
    with pytest.raises(ConfigError, match="TF_CONFIG must be a JSON object with a cluster"):
        st.resolve(RunConfig())


def test_select_devices():
    gpus = ["/gpu:0", "/gpu:1", "/gpu:2"]
    assert st.select_devices(RuntimeConfig(devices=["/gpu:2"]), gpus) == ["/gpu:2"]
    assert st.select_devices(RuntimeConfig(num_gpus=2), gpus) == ["/gpu:0", "/gpu:1"]
    assert st.select_devices(RuntimeConfig(), gpus) == gpus
    assert st.select_devices(RuntimeConfig(), []) == ["/cpu:0"]
    with pytest.raises(ConfigError, match="runtime.num_gpus asks for 2 GPUs but 0 are visible"):
        st.select_devices(RuntimeConfig(num_gpus=2), [])


@pytest.mark.parametrize(("rule", "expected"), [("none", 0.1), ("linear", 0.4),
                                                 ("sqrt", 0.2)])
def test_learning_rate_scaling(rule, expected):
    assert math.isclose(st.scaled_learning_rate(0.1, rule, 4), expected)


def test_resolve_one_device_on_cpu():
    import tensorflow as tf

    resolved = st.resolve(RunConfig.from_flat({"batch_size": 32}))
    assert resolved.kind == "one_device"
    assert resolved.strategy is tf.distribute.get_strategy()  # the default: no wrapping
    assert resolved.replicas == 1
    pinned = st.resolve(RunConfig.from_flat({"devices": ["/cpu:1"]}))
    assert type(pinned.strategy).__name__ == "OneDeviceStrategy"
    assert pinned.devices == ["/cpu:1"]
    assert resolved.global_batch_size == 32
    assert resolved.is_chief


def test_resolve_mirrored_over_two_cpu_devices_scales_batch_and_lr():
    cfg = RunConfig.from_flat({"strategy": "mirrored", "devices": ["/cpu:0", "/cpu:1"],
                               "batch_size": 16, "learning_rate": 0.01, "lr_scaling": "linear"})
    resolved = st.resolve(cfg)
    assert type(resolved.strategy).__name__ == "MirroredStrategy"
    assert resolved.replicas == 2
    assert resolved.global_batch_size == 32
    assert math.isclose(resolved.learning_rate, 0.02)
    assert resolved.to_dict()["replicas_in_sync"] == 2


def test_resolve_tpu_fails_clearly_when_no_tpu_answers():
    def no_tpu(name):
        raise ValueError(f"Could not find TPU {name}")

    cfg = RunConfig.from_flat({"strategy": "tpu", "tpu": "my-tpu", "accelerator": "tpu"})
    with pytest.raises(ConfigError, match="runtime.strategy is 'tpu' but no TPU answered for "
                                          "runtime.tpu='my-tpu'"):
        st.resolve(cfg, tpu_resolver=no_tpu)


def test_a_named_tpu_that_does_not_answer_fails_under_auto_too():
    """Asked for by name, a TPU is not silently replaced by this host's CPU."""
    asked = []

    def no_tpu(name):
        asked.append(name)
        raise ValueError("no TPU")

    cfg = RunConfig.from_flat({"tpu": "my-tpu", "accelerator": "tpu"})
    with pytest.raises(ConfigError, match=r"runtime.tpu names a TPU but no TPU answered for "
                                          r"runtime.tpu='my-tpu': ValueError: no TPU"):
        st.resolve(cfg, tpu_resolver=no_tpu)
    assert asked == ["my-tpu"]


def test_a_tpu_named_without_the_tpu_accelerator_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"runtime.tpu names a TPU \('my-tpu'\) but "
                                          r"runtime.accelerator is 'cpu': the TPU would be "
                                          r"ignored"):
        RunConfig.from_flat({"tpu": "my-tpu"})


def test_multi_worker_for_one_worker_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"runtime.strategy 'multi_worker' needs "
                                          r"runtime.workers above 1, got runtime.workers=1"):
        RunConfig.from_flat({"strategy": "multi_worker"})


@pytest.mark.parametrize("tf_config", [None, '{"cluster": {"worker": ["localhost:1"]}, '
                                              '"task": {"type": "worker", "index": 0}}'])
def test_a_worker_of_a_cluster_without_its_tf_config_is_refused(tf_config, monkeypatch):
    """A pod that lost its TF_CONFIG would train alone, as its own chief."""
    monkeypatch.setattr(st.cluster, "current", lambda: tf_config)
    cfg = RunConfig.from_flat({"strategy": "multi_worker", "workers": 2})
    with pytest.raises(ConfigError, match=r"runtime.workers is 2 but this process is not a "
                                          r"worker of a cluster \(TF_CONFIG is "):
        st.resolve(cfg)


def test_resolve_auto_does_not_probe_for_a_tpu_on_a_plain_host():
    def must_not_be_called(name):
        raise AssertionError("probed for a TPU")

    assert st.resolve(RunConfig(), tpu_resolver=must_not_be_called).kind == "one_device"


H200 = {"platform": "gpu", "name": "NVIDIA H200", "count": 1, "compute_capability": "9.0"}
T4 = {"platform": "gpu", "name": "Tesla T4", "count": 1, "compute_capability": "7.5"}
CPU = {"platform": "cpu", "name": "x86_64", "count": 1, "compute_capability": None}
TPU = {"platform": "tpu", "name": "TPU v5", "count": 4, "compute_capability": None}


@pytest.mark.parametrize(("requested", "accelerator", "expected", "why"), [
    ("auto", TPU, "mixed_bfloat16", "a TPU"),
    ("auto", H200, "mixed_bfloat16", "GPU NVIDIA H200 has bf16 matrix units (compute "
                                     "capability 9.0 >= 8.0)"),
    ("auto", {**H200, "compute_capability": "8.0"}, "mixed_bfloat16", "8.0 >= 8.0"),
    ("auto", T4, "float32", "GPU Tesla T4 has no bf16 matrix units (compute capability "
                            "7.5 < 8.0)"),
    ("auto", {**T4, "compute_capability": None}, "float32", "unknown < 8.0"),
    ("auto", CPU, "float32", "cpu has no bf16 matrix units"),
    ("auto", {}, "float32", "no bf16"),
    ("mixed_float16", CPU, "mixed_float16", "is 'mixed_float16'"),
    ("float32", H200, "float32", "is 'float32'"),
])
def test_precision_policy(requested, accelerator, expected, why):
    from training.train.placement import precision_policy

    policy, reason = precision_policy(requested, accelerator)
    assert policy == expected and why in reason, reason


def test_tpu_path_connects_through_the_resolver_and_reports_a_missing_tpu(tmp_path):
    """The faked resolver points at a real local TensorFlow server: connecting works for
    real, and initialising the TPU system fails there (no TPU), as a clear ConfigError.
    In a subprocess, because connecting to a cluster changes the process's TF context."""
    import subprocess
    import sys

    code = '''
import tensorflow as tf
from training.train import strategy as st
from training.config import RunConfig
from training.errors import ConfigError

server = tf.distribute.Server.create_local_server()
calls = []

def fake_resolver(name):
    calls.append(name)
    host = server.target.replace("grpc://", "")
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": [host]}), master=host, task_type="worker",
        task_id=0, rpc_layer="grpc")

try:
    st.resolve(RunConfig.from_flat({"strategy": "auto", "tpu": "v5e-8", "accelerator": "tpu"}),
               tpu_resolver=fake_resolver)
except ConfigError as exc:
    print("ERROR", exc)
print("CALLS", calls)
print("DEVICES", [d.name for d in tf.config.list_logical_devices()])
'''
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout
    assert "CALLS ['v5e-8']" in out, proc.stderr[-2000:]
    assert "ERROR runtime.tpu 'v5e-8' answered at grpc://localhost:" in out
    assert "could not be initialised: AssertionError" in out
    assert "/job:worker/replica:0/task:0/device:CPU:0" in out  # really connected


@pytest.mark.parametrize(("requested", "kind", "expected"), [
    (0, "one_device", 10), (0, "mirrored", 10), (0, "multi_worker", 10), (0, "tpu", 1),
    (4, "mirrored", 4), (1, "one_device", 1),
])
def test_steps_per_execution_auto(requested, kind, expected):
    assert st.steps_per_execution(requested, kind) == expected


def test_all_reduce_and_gradient_pack_settings_refuse_bad_values():
    with pytest.raises(ConfigError, match=r"runtime.all_reduce must be one of 'auto', 'ring', "
                                          r"'nccl', got 'hierarchical'"):
        RunConfig.from_flat({"all_reduce": "hierarchical"})
    with pytest.raises(ConfigError, match="runtime.gradient_pack_mb must be between 0 and "
                                          "4096, got -1"):
        RunConfig.from_flat({"gradient_pack_mb": -1})


TWO_WORKERS = ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
               '"task": {"type": "worker", "index": 0}}')


def test_resolve_builds_multi_worker_with_the_configured_communication_options(monkeypatch):
    """A real MultiWorkerMirroredStrategy carries the timeout, implementation and pack size
    the config asks for. The project's check sees a two-worker TF_CONFIG; TensorFlow's own
    resolver reads the (unset) environment and builds its one-worker mode, so no server
    starts in the test process."""
    import tensorflow as tf

    monkeypatch.setattr(st.cluster, "current", lambda: TWO_WORKERS)
    cfg = RunConfig.from_flat({"strategy": "multi_worker", "workers": 2, "all_reduce": "ring",
                               "gradient_pack_mb": 4, "collective_timeout_s": 60})
    resolved = st.resolve(cfg)
    assert isinstance(resolved.strategy, tf.distribute.MultiWorkerMirroredStrategy)
    options = resolved.strategy.extended._communication_options
    assert options.bytes_per_pack == 4 * 1024 * 1024
    assert options.timeout_seconds == 60
    assert options.implementation == tf.distribute.experimental.CommunicationImplementation.RING
    default = st.communication_options(RuntimeConfig(collective_timeout_s=0), gpus=0)
    assert (default.bytes_per_pack, default.timeout_seconds, default.implementation.value) == (
        0, None, "AUTO")


def test_nccl_without_a_gpu_is_refused_when_the_strategy_is_built(monkeypatch):
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU: NCCL is allowed here")
    monkeypatch.setattr(st.cluster, "current", lambda: TWO_WORKERS)
    cfg = RunConfig.from_flat({"strategy": "multi_worker", "workers": 2, "all_reduce": "nccl"})
    with pytest.raises(ConfigError, match=r"runtime.all_reduce is 'nccl', which needs a GPU on "
                                          r"every worker, but this worker sees none.*use "
                                          r"'auto' or 'ring' \(allowed: auto, ring, nccl\)"):
        st.resolve(cfg)
    assert st.communication_options(cfg.runtime, gpus=1).implementation.value == "NCCL"


_KEY_BASES = itertools.count(7_000_000, 100_000)


@pytest.mark.parametrize(("pack_mb", "packs"), [(0, 1), (1, 2)])
def test_keras_fit_all_reduces_its_gradients_with_the_strategy_options(pack_mb, packs,
                                                                       monkeypatch):
    """Keras 3's optimizer all-reduces the gradients through ReplicaContext.all_reduce
    with no options of its own, so the strategy's options decide the collectives of
    fit's train step: their implementation, timeout and number (one per pack and
    replica). A MultiWorkerMirroredStrategy over this process's two CPU devices runs
    the same collective all-reduce as two workers do."""
    import keras
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.eager import context

    runtime = RuntimeConfig(all_reduce="ring", gradient_pack_mb=pack_mb, collective_timeout_s=77)
    # Collective group keys start at the class's key base: two strategies over the same
    # devices in one process would otherwise share keys (TF's own tests move it too).
    monkeypatch.setattr(tf.distribute.MultiWorkerMirroredStrategy, "_collective_key_base",
                        next(_KEY_BASES))
    strategy = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(
        ["/cpu:0", "/cpu:1"], communication_options=st.communication_options(runtime, gpus=0))
    with strategy.scope():
        inputs = keras.Input((64,))
        hidden = keras.layers.Dense(512, activation="relu")(inputs)  # 128 KiB of kernel
        hidden = keras.layers.Dense(512, activation="relu")(hidden)  # 1 MiB
        model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=1)
    data = tf.data.Dataset.from_tensor_slices(
        (np.ones((32, 64), "float32"), np.zeros(32, "int64"))).batch(16)
    before = set(context.context().list_function_names())
    model.fit(data, epochs=1, verbose=0)
    collectives = [
        node for name in set(context.context().list_function_names()) - before
        for node in context.context().get_function_def(name).node_def
        if node.op.startswith("CollectiveReduce") and "one_step_on_data" in name
    ]
    # TF packs the reversed gradient list greedily: with 1 MiB, [dense_2's, dense_1's]
    # then [dense's]; with 0, everything in one concatenated all-reduce.
    assert len(collectives) == packs * strategy.num_replicas_in_sync
    assert {n.attr["communication_hint"].s for n in collectives} == {b"ring"}
    assert {n.attr["timeout_seconds"].f for n in collectives} == {77.0}
