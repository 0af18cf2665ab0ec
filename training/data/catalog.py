"""The dataset catalog: a dataset name (and version) to its tensorflow-datasets builder.

Every dataset is a tfds builder: the built-in offline ``digits``
(``training/data/digits.py``, registered when that module is imported) or any tfds
image-classification dataset (mnist, fashion_mnist, cifar10, ...). A name that is not
one, a version tfds does not have, or a dataset that is not an image and a class label
is a ``ConfigError`` that says what is allowed.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from training.errors import ConfigError

# Offline datasets: name -> module whose import registers the builder, and the version
# the builder has (here, not only in the builder, so that a cache hit is found without
# importing tensorflow-datasets: ``staging.cached``).
OFFLINE_BUILDERS = {"digits": "training.data.digits"}
OFFLINE_VERSIONS = {"digits": "1.0.0"}
DEFAULT_VERSION_RECORD = "default-version.json"  # <staging_dir>/<name>/: tfds's pick


def default_version(name: str, staging_dir: str | os.PathLike) -> str | None:
    """The version ``name`` resolves to without one asked for, known without tfds: an
    offline dataset's, or the one tfds picked when it was last staged (recorded by
    ``record_default_version``) if the same tensorflow-datasets is installed; else None."""
    if name in OFFLINE_VERSIONS:
        return OFFLINE_VERSIONS[name]
    import json
    from importlib.metadata import version

    try:
        record = json.loads((Path(staging_dir) / name / DEFAULT_VERSION_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get(
            "tensorflow_datasets") != version("tensorflow-datasets"):
        return None
    return record.get("version")


def record_default_version(version_dir: Path, picked: str) -> None:
    """Note, beside ``version_dir`` (``<staging_dir>/<name>/<version>``), which version
    tfds picked for the dataset asked without one."""
    import json
    from importlib.metadata import version

    path = version_dir.parent / DEFAULT_VERSION_RECORD
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": picked,
                               "tensorflow_datasets": version("tensorflow-datasets")}) + "\n")
    os.replace(tmp, path)


def get_builder(name: str, version: str | None, staging_dir: str | os.PathLike) -> Any:
    """The tfds builder for ``name``; a clear ConfigError when there is none."""
    import tensorflow_datasets as tfds

    if name in OFFLINE_BUILDERS:
        importlib.import_module(OFFLINE_BUILDERS[name])
    spec = f"{name}:{version}" if version else name
    try:
        builder = tfds.builder(spec, data_dir=os.fspath(staging_dir))
    except AssertionError as exc:  # tfds asserts on a version it does not have
        raise ConfigError(f"dataset.version {version!r} is not available for {name!r}: "
                          f"{str(exc).splitlines()[-1][-300:]}") from None
    except (tfds.core.registered.DatasetNotFoundError, ValueError) as exc:
        if version and name in tfds.list_builders(with_community_datasets=False):
            raise ConfigError(
                f"dataset.version {version!r} is not available for {name!r}: "
                f"{str(exc).splitlines()[0]}"
            ) from None
        raise ConfigError(
            f"dataset.name must be 'digits' or a tensorflow-datasets image-classification "
            f"dataset (e.g. mnist, fashion_mnist, cifar10), got {name!r}"
        ) from None
    image_shape, num_classes = _image_classification_info(builder)
    if image_shape is None:
        raise ConfigError(
            f"dataset.name must be an image-classification dataset (an image and a class "
            f"label as supervised keys), got {name!r}"
        )
    return builder


def _image_classification_info(builder: Any) -> tuple[tuple[int, ...] | None, int]:
    import tensorflow_datasets as tfds

    info = builder.info
    keys = info.supervised_keys
    if not keys or len(keys) != 2:
        return None, 0
    image, label = info.features[keys[0]], info.features[keys[1]]
    if not isinstance(image, tfds.features.Image) or not isinstance(
        label, tfds.features.ClassLabel
    ):
        return None, 0
    return tuple(image.shape), label.num_classes


def dataset_info(builder: Any) -> dict[str, Any]:
    """Input shape and class count for the model builder."""
    shape, num_classes = _image_classification_info(builder)
    return {"input_shape": shape, "num_classes": num_classes}
