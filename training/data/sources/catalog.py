"""The dataset catalog: a dataset name (and version) to its tensorflow-datasets builder.

Every dataset is a tfds builder: the built-in offline ``digits``
(``training/data/sources/digits.py``, registered when that module is imported) or any tfds
image-classification dataset (mnist, fashion_mnist, cifar10, ...). A name that is not
one, a version tfds does not have, or a dataset that is not an image and a class label
is a ``ConfigError`` that says what is allowed.

A dataset tfds must download is fetched only from a machine that reaches its source:
``downloads_fail_fast`` connects once to each host (or the proxy in front of it) before
tfds's first request to it, so an offline machine fails in seconds with one line naming
the dataset and the host, instead of after tfds's retries (10 per file, minutes). Once a
host answered, tfds's own retries handle its transient errors as before.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from training.errors import ConfigError, DatasetError, shown

# Offline datasets: name -> module whose import registers the builder, and the version
# the builder has (here, not only in the builder, so that a cache hit is found without
# importing tensorflow-datasets: ``staging.cached``).
OFFLINE_BUILDERS = {"digits": "training.data.sources.digits"}
OFFLINE_VERSIONS = {"digits": "1.0.0"}
DEFAULT_VERSION_RECORD = "default-version.json"  # <staging_dir>/<name>/: tfds's pick
REACH_TIMEOUT_S = 5.0  # one TCP connection to a download's host, before tfds's first try
ABANDONED_S = 120.0  # how long a failed download's left-over requests stay refused


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
    """Input shape and class count for the model builder, from a tfds-style builder (a
    JAX process's reader says them without tfds: ``StagedInfo.dataset_info``)."""
    shape, num_classes = _image_classification_info(builder)
    return {"input_shape": shape, "num_classes": num_classes}


@contextlib.contextmanager
def downloads_fail_fast(name: str, staging_dir: str | os.PathLike) -> Iterator[None]:
    """While tfds prepares ``name``: before its downloader's first request to a host,
    one TCP connection to that host (or to the proxy ``requests`` would use for it, from
    the environment), at most ``REACH_TIMEOUT_S``; a host that does not answer is a
    ``DatasetError`` at once, for every file from it. Only files tfds really fetches are
    checked: a download it finds already on disk needs no network."""
    from tensorflow_datasets.core.download import downloader

    opened = downloader._open_url  # the one call through which tfds fetches a URL
    answers: dict[tuple[str, int], str | None] = {}  # (host, port) -> why not reached
    lock = threading.Lock()

    def open_url(url: str, **kwargs: Any) -> Any:
        host, port, proxy = _first_hop(url)
        with lock:  # tfds fetches files in parallel: one connection per host
            if (host, port) not in answers:
                answers[host, port] = _unreachable(host, port)
        if answers[host, port] is not None:
            where = f"{host}:{port}" + (f", the proxy to {proxy}," if proxy else "")
            raise DatasetError(
                f"cannot download dataset {name!r}: this machine cannot reach {where} "
                f"({answers[host, port]}); stage it on a machine that can (python -m "
                f"training stage --dataset {name} --staging-dir DIR) and copy "
                f"DIR/{name.split('/')[0]} into {os.fspath(staging_dir)}: staging here "
                "then finds it prepared (docs/datasets.md)")
        return opened(url, **kwargs)

    downloader._open_url = open_url
    try:
        yield
    finally:
        # tfds's pool still holds the other files of a download that failed here, and
        # runs them after this returns: they stay refused for a while (not sent through
        # the plain downloader, whose 10 retries a file would keep the process busy).
        refused = {hop for hop, why in answers.items() if why is not None}
        downloader._open_url = (_refusing(opened, refused, name) if refused else opened)


def _refusing(opened: Any, refused: set[tuple[str, int]], name: str) -> Any:
    """tfds's ``_open_url`` after a download of ``name`` failed: for ``ABANDONED_S`` its
    left-over requests to the hosts in ``refused`` fail at once; anything else, and
    everything after, is ``opened``."""
    until = time.monotonic() + ABANDONED_S

    def open_url(url: str, **kwargs: Any) -> Any:
        host, port, _ = _first_hop(url)
        if (host, port) in refused and time.monotonic() < until:
            raise DatasetError(f"download of dataset {name!r} abandoned: {host}:{port} "
                               "was not reached")
        return opened(url, **kwargs)
    return open_url


def _first_hop(url: str) -> tuple[str, int, str | None]:
    """(host, port) that fetching ``url`` connects to first, and the URL's own host
    when that is a proxy (else None)."""
    import requests

    proxy = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
    if proxy and "://" not in proxy:  # requests reads "host:port" as http://host:port
        proxy = f"http://{proxy}"
    target = urlsplit(proxy or url)
    port = target.port or {"https": 443, "http": 80, "ftp": 21}.get(target.scheme, 443)
    return target.hostname or "", port, urlsplit(url).hostname if proxy else None


def _unreachable(host: str, port: int) -> str | None:
    """Why one TCP connection to ``host:port`` failed, or None when it was accepted."""
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:  # no DNS, refused, no route, timed out
        return f"{type(exc).__name__}: {shown(exc)}"
    return None
