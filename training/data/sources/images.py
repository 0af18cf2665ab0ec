"""A team's own labelled images (or TFRecords), staged by date partition.

Layout under ``data_uri`` (a directory or ``s3://bucket/prefix``, read through the
registry's stores: S3 credentials from the Airflow connection or boto3's chain)::

    dt=2026-11-30/_SUCCESS               written last by whoever lands the partition
    dt=2026-11-30/<label>/<image file>   data_source images (anything Pillow decodes)
    dt=2026-11-30/<file>.tfrecord        data_source tfrecord: tf.train.Example with
                                         'image' (encoded bytes) and 'label' (a name as
                                         bytes, or an int64)

**Which partitions**: every complete one (it has ``_SUCCESS``) dated up to ``until``
(included; none: all), within the last ``window_days`` days when that is set; a
partition without its marker is still being landed and is left out (logged).

**The snapshot**: its id is the SHA-256 of the selected partitions' object keys and
``_SUCCESS`` markers, the image shape and the split rule, so the same night staged again
is the same snapshot (a cache hit) and a new partition makes a new one. Each partition
is decoded once into shards of its own (``snapshot/partition_shards.py``), and the
snapshot under ``<staging_dir>/<name>/<snapshot id>/1.0.0/`` is the list of its
partitions' shards (``snapshot/own_snapshot.py``): it goes through the same staging,
manifest and verification as ``digits`` or mnist, and ``snapshot/snapshot_reader.py``
reads it back.

**Each image** is decoded with Pillow, converted to the channels asked for (L, RGB,
RGBA), resized to ``image_shape`` and put in a split by the SHA-256 of its bytes: the
first ``test_percent`` of the hash range is test, the next ``validation_percent``
validation, the rest train. An image never moves between splits from night to night,
and two copies of one file land in the same split. A file that cannot be decoded is
left out and listed with its reason (``rejected``, checked by ``validate_data``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from typing import Any

from training.config import DatasetConfig
from training.data.sources.landing import SUCCESS
from training.errors import DatasetError, StorageError, shown

log = logging.getLogger(__name__)

PARTITION = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")
MARKER = SUCCESS  # landing.py writes it last; other tools' empty _SUCCESS works too
SNAPSHOT_FORMAT = 2  # changes when what the snapshot id covers or its layout changes
MARKER_THREADS = 16  # the partitions' markers are read concurrently
MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def image_shape(text: str) -> tuple[int, int, int]:
    """``"28x28x1"`` -> (28, 28, 1)."""
    height, width, channels = (int(n) for n in text.split("x"))
    return height, width, channels


def split_of(data: bytes, test_percent: int, validation_percent: int) -> str:
    """The split an image belongs to, from the SHA-256 of its bytes (stable forever)."""
    bucket = int.from_bytes(hashlib.sha256(data).digest()[:8], "big") % 100
    if bucket < test_percent:
        return "test"
    if bucket < test_percent + validation_percent:
        return "validation"
    return "train"


def decode(data: bytes, shape: tuple[int, int, int]) -> Any:
    """Encoded image bytes -> uint8 array of ``shape`` (Pillow; ValueError if unreadable)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    height, width, channels = shape
    try:
        with Image.open(io.BytesIO(data)) as image:
            image = image.convert(MODES[channels])
            if image.size != (width, height):
                image = image.resize((width, height), Image.Resampling.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
    except UnidentifiedImageError:
        raise ValueError("not a readable image: Pillow knows no such image format") from None
    except (OSError, SyntaxError) as exc:
        raise ValueError(f"not a readable image ({type(exc).__name__}: {shown(exc)})") from None
    return array.reshape(height, width, channels)


def select_partitions(folders: list[str], until: str | None, window_days: int) -> list[str]:
    """The ``dt=YYYY-MM-DD`` folders (real dates) up to ``until`` and within the last
    ``window_days`` days (0: all), sorted."""
    last = date.fromisoformat(until) if until else None
    first = last - timedelta(days=window_days - 1) if last and window_days else None
    chosen = []
    for folder in folders:
        match = PARTITION.match(folder)
        if not match:
            continue
        try:
            day = date.fromisoformat(match.group(1))
        except ValueError:  # dt=2026-13-45: not a date, not a partition
            continue
        if not ((last and day > last) or (first and day < first)):
            chosen.append(folder)
    return sorted(chosen)


def _landed_files(marker: bytes) -> list[str] | str | None:
    """The files a ``landing.py`` marker lists, ``"replacing"`` while it replaces the
    partition, or None for a marker of another tool (then every file of the partition)."""
    try:
        data = json.loads(marker)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if data.get("state") == "replacing":
        return "replacing"
    if data.get("state") == "complete" and isinstance(data.get("entries"), list):
        return [entry["path"] for entry in data["entries"]]
    return None


class Snapshot:
    """The partitions a run stages, read from a store; its id and its examples."""

    def __init__(self, cfg: DatasetConfig, store: Any) -> None:
        self.cfg, self.store = cfg, store
        self.shape = image_shape(cfg.image_shape)
        try:  # the days, not every file of every day: a night lists what it reads
            in_range = select_partitions(store.list_folders(""), cfg.until, cfg.window_days)
        except StorageError as exc:
            raise DatasetError(f"cannot list dataset.uri {cfg.uri!r}: {shown(exc)}") from None
        with ThreadPoolExecutor(MARKER_THREADS) as pool:
            markers = list(pool.map(self._marker, in_range))
        self.partitions: dict[str, list[str]] = {}
        self.markers: dict[str, bytes] = {}
        incomplete = []
        for partition, marker in zip(in_range, markers, strict=True):
            landed = _landed_files(marker) if marker is not None else "replacing"
            if landed == "replacing":  # no marker yet, or landing.py is replacing it
                incomplete.append(partition)
                continue
            if landed is None:  # another tool's marker: every file of the partition
                keys = self._list(f"{partition}/")
            else:  # exactly what was landed, not leftovers
                keys = sorted([f"{partition}/{path}" for path in landed]
                              + [f"{partition}/{MARKER}"])
            self.partitions[partition], self.markers[partition] = keys, marker
        for partition in incomplete:
            log.info("staging %s: partition %s has no %s yet (still landing): left out",
                     cfg.name, partition, MARKER)
        if not self.partitions:
            raise DatasetError(
                f"dataset.uri {cfg.uri!r} has no complete dt=YYYY-MM-DD partition (with "
                f"{MARKER})" + (f" up to {cfg.until}" if cfg.until else "")
                + (f" in the last {cfg.window_days} days" if cfg.window_days else ""))
        digest = hashlib.sha256(json.dumps({
            "format": SNAPSHOT_FORMAT, "source": cfg.source, "shape": cfg.image_shape,
            "split": [cfg.test_percent, cfg.validation_percent],
            "partitions": {p: self.digest(p) for p in self.partitions},
        }, sort_keys=True).encode())
        self.id = f"{next(iter(self.partitions))[3:]}_{list(self.partitions)[-1][3:]}_" \
                  f"{digest.hexdigest()[:12]}".replace("-", "")

    def digest(self, partition: str) -> dict[str, str]:
        """What a partition is made of, in two SHA-256s: its object keys and its marker."""
        return {"keys": hashlib.sha256("\n".join(self.partitions[partition]).encode())
                .hexdigest(), "marker": hashlib.sha256(self.markers[partition]).hexdigest()}

    def _marker(self, partition: str) -> bytes | None:
        """A partition's ``_SUCCESS``, None when it has none (still landing)."""
        try:
            found = self.store.get_with_etag(f"{partition}/{MARKER}")
        except StorageError as exc:
            raise DatasetError(f"cannot read {partition}/{MARKER} of dataset.uri "
                               f"{self.cfg.uri!r}: {shown(exc)}") from None
        return None if found is None else found[0]

    def _list(self, prefix: str) -> list[str]:
        try:
            return self.store.list(prefix)
        except StorageError as exc:
            raise DatasetError(f"cannot list {prefix} of dataset.uri {self.cfg.uri!r}: "
                               f"{shown(exc)}") from None

    def _get(self, key: str) -> bytes:
        try:
            return self.store.get_bytes(key)
        except StorageError as exc:
            raise DatasetError(f"cannot read {key} of dataset.uri {self.cfg.uri!r}: "
                               f"{shown(exc)}") from None

    def files(self, partition: str) -> list[str]:
        """A partition's data files: not the markers or other bookkeeping (names starting
        with '_' or '.', as _SUCCESS, _LANDING, .crc files)."""
        return [k for k in self.partitions[partition]
                if not k.rsplit("/", 1)[-1].startswith(("_", "."))]

    def encoded(self, key: str) -> Iterator[tuple[str, str, bytes]]:
        """(example key, label, encoded image) of one file of the partitions."""
        data = self._get(key)
        if self.cfg.source == "images":
            parts = key.split("/")
            if len(parts) != 3:
                return  # not <partition>/<label>/<file>: nothing to learn from
            yield key, parts[1], data
            return
        import tensorflow as tf

        with tempfile.NamedTemporaryFile(suffix=".tfrecord") as tmp:
            tmp.write(data)
            tmp.flush()
            records = tf.data.TFRecordDataset(tmp.name).as_numpy_iterator()
            for index, record in enumerate(records):
                example = tf.train.Example.FromString(record).features.feature
                label = example["label"]
                name = (label.bytes_list.value[0].decode() if label.bytes_list.value
                        else str(label.int64_list.value[0]))
                yield f"{key}#{index}", name, example["image"].bytes_list.value[0]
