"""Shared fixtures: one staged copy of ``digits`` and one trained run per test session.

TensorFlow is configured once, before anything initialises it: two logical CPU devices,
so MirroredStrategy can be exercised for real on a CPU-only machine.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_configure(config: pytest.Config) -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )


@pytest.fixture(scope="session")
def staging_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.fspath(tmp_path_factory.mktemp("datasets"))


@pytest.fixture(scope="session")
def staged_digits(staging_dir: str):
    from training import datasets
    from training.config import DatasetConfig

    return datasets.stage(DatasetConfig(staging_dir=staging_dir))


@pytest.fixture(scope="session")
def trained_run(staged_digits, tmp_path_factory: pytest.TempPathFactory):
    """The seed's mlp trained briefly on digits (one device), with its config."""
    from training.config import RunConfig
    from training.fit import train

    cfg = RunConfig.from_flat({
        "staging_dir": staged_digits.staging_dir,
        "output_dir": os.fspath(tmp_path_factory.mktemp("runs")),
        "epochs": 6,
        "strategy": "one_device",
    })
    return cfg, train(cfg, staged_digits)
