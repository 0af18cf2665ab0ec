"""One partition of a team's data, decoded once into shards of its own.

A night's snapshot (``own_snapshot.py``) is the list of its partitions' shards, so a
night decodes only what landed since the last one. A partition's shards live under
``<staging_dir>/<name>/partitions/<partition>_<key>/`` and are keyed by what they are
made from: the partition's object keys and ``_SUCCESS`` marker (its content), the data
source, the image shape and the split rule (``partition_key``). A partition replaced
with other content has another marker, so another key and new shards; the old ones stay
for the snapshots that use them until ``staging_cleanup.py`` removes them.

The directory holds one TFRecord file per split (``train.tfrecord``, ...) of
``tf.train.Example`` records ``{"image": PNG bytes, "label": the class name, "key":
the example's key}`` in the order of the partition's sorted file keys, and
``partition.json``, written last (the directory is built under a temporary name and
renamed whole): per split its examples, class counts by name, exact per-channel pixel
sums and squares, and each image's content hash (``statistics.content_hash``), in file
order; the rejected files with their reasons; and the shard files' sizes and SHA-256.
That is all that the snapshot's statistics, the per-day drift check and the manifest
need: a snapshot reads no image to compute them.

Fetching is concurrent (``FETCH_CONCURRENCY`` requests in flight, sized for a real S3
server) and streaming: a bounded window of files is fetched and decoded ahead of the
writer, which writes each image as soon as its turn comes, so memory stays flat in the
number of images (what grows is the record's 16-byte hash per image).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.data.manifest import dumps, list_files
from training.data.snapshot.statistics import content_hash
from training.data.sources.images import MODES, Snapshot, decode, split_of
from training.errors import DatasetError, shown

log = logging.getLogger(__name__)

PARTITION_FORMAT = 1  # changes when what a partition's shards hold changes
RECORD = "partition.json"
SPLITS = ("train", "validation", "test")
FETCH_CONCURRENCY = 32  # requests in flight: the S3 client's pool is sized to match
WINDOW = 4 * FETCH_CONCURRENCY  # image files fetched ahead of the writer, at most
TFRECORD_WINDOW = 4  # TFRecord files (each may hold many images) ahead, at most


def partition_key(snapshot: Snapshot, partition: str) -> str:
    """16 hex digits over what the partition's shards are made from."""
    cfg = snapshot.cfg
    return hashlib.sha256(json.dumps({
        "format": PARTITION_FORMAT, "source": cfg.source, "shape": cfg.image_shape,
        "split": [cfg.test_percent, cfg.validation_percent], "partition": partition,
        **snapshot.digest(partition)}, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PartitionShards:
    """A partition's staged shards: where they are and their ``partition.json``."""

    path: Path
    record: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    def files(self) -> list[str]:
        """The shard files' names, in split order."""
        return [s["file"] for s in self.record["splits"].values()]


def read_record(path: Path) -> dict[str, Any]:
    """A partition's ``partition.json``; DatasetError saying how to fix a broken one."""
    try:
        record = json.loads((path / RECORD).read_text())
        if record.get("format") != PARTITION_FORMAT or not isinstance(record["splits"], dict):
            raise ValueError(f"format {record.get('format')!r}, expected {PARTITION_FORMAT}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"staged partition {path} is unreadable ({shown(exc)}): delete "
                           "it and stage again") from None
    return record


def ensure(snapshot: Snapshot, partition: str, root: Path) -> tuple[PartitionShards, bool]:
    """The partition's shards under ``root``, staged now unless they already are; and
    whether they were staged now. The caller holds the partitions' lock."""
    path = root / f"{partition}_{partition_key(snapshot, partition)}"
    if (path / RECORD).is_file():
        record = read_record(path)
        for entry in record["files"]:  # sizes here; every byte is checked at training
            shard = path / entry["path"]
            if not shard.is_file() or shard.stat().st_size != entry["size"]:
                raise DatasetError(f"staged partition {path} lost or changed {entry['path']}:"
                                   " delete the directory and stage again")
        return PartitionShards(path, record), False
    tmp = root / f".{path.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        record = _write(snapshot, partition, tmp)
        (tmp / RECORD).write_bytes(dumps(record))
        os.rename(tmp, path)  # whole or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("staging %s: partition %s decoded into %s (%d examples, %d rejected)",
             snapshot.cfg.name, partition, path.name,
             sum(s["num_examples"] for s in record["splits"].values()),
             len(record["rejected"]))
    return PartitionShards(path, record), True


def _ordered(pool: ThreadPoolExecutor, work: Any, items: Iterable[str],
             window: int) -> Iterator[Any]:
    """``work(item)`` for every item, in order, with at most ``window`` of them done or
    in flight ahead of the consumer."""
    pending: deque[Any] = deque()
    for item in items:
        pending.append(pool.submit(work, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


class _SplitTotals:
    """What partition.json keeps of one split, added up example by example."""

    def __init__(self, channels: int) -> None:
        self.count = 0
        self.classes: dict[str, int] = {}
        self.pixels = 0
        self.sums = [0] * channels
        self.squares = [0] * channels
        self.hashes: list[str] = []

    def add(self, label: str, moments: tuple[int, list[int], list[int]], digest: str) -> None:
        self.count += 1
        self.classes[label] = self.classes.get(label, 0) + 1
        pixels, sums, squares = moments
        self.pixels += pixels
        self.sums = [a + b for a, b in zip(self.sums, sums, strict=True)]
        self.squares = [a + b for a, b in zip(self.squares, squares, strict=True)]
        self.hashes.append(digest)

    def record(self, file: str) -> dict[str, Any]:
        return {"file": file, "num_examples": self.count,
                "class_counts": dict(sorted(self.classes.items())), "pixels": self.pixels,
                "sums": self.sums, "squares": self.squares, "hashes": self.hashes}


def _prepared(snapshot: Snapshot, key: str) -> list[tuple]:
    """One file's examples, fetched and decoded (a worker thread's part): per example
    (key, label, split, PNG bytes, moments, content hash), or (key, label, reason)."""
    cfg = snapshot.cfg
    out: list[tuple] = []
    try:
        for example_key, label, data in snapshot.encoded(key):
            try:
                image = decode(data, snapshot.shape)
            except ValueError as exc:
                out.append((example_key, label, str(exc)))
                continue
            out.append((example_key, label,
                        split_of(data, cfg.test_percent, cfg.validation_percent),
                        _shard_png(data, image), _moments(image),
                        content_hash(image).hex()))
    except DatasetError:
        raise  # the store failed: the night cannot be staged
    except Exception as exc:  # a TFRecord file that does not parse
        out.append((key, "", f"cannot read the file ({type(exc).__name__}: {shown(exc)})"))
    return out


def _write(snapshot: Snapshot, partition: str, into: Path) -> dict[str, Any]:
    """Fetch, decode and write the partition's shards into ``into``; its record."""
    import tensorflow as tf

    channels = snapshot.shape[2]
    files = snapshot.files(partition)
    totals = {split: _SplitTotals(channels) for split in SPLITS}
    writers: dict[str, Any] = {}
    rejected, attempted = [], 0
    try:
        with ThreadPoolExecutor(FETCH_CONCURRENCY) as pool:
            window = WINDOW if snapshot.cfg.source == "images" else TFRECORD_WINDOW
            for examples in _ordered(pool, lambda k: _prepared(snapshot, k), files, window):
                for example in examples:
                    attempted += 1
                    if len(example) == 3:
                        rejected.append({"path": example[0], "reason": example[2]})
                        continue
                    key, label, split, png, moments, digest = example
                    if split not in writers:
                        writers[split] = tf.io.TFRecordWriter(os.fspath(into / f"{split}"
                                                                                 ".tfrecord"))
                    writers[split].write(_example(png, label, key))
                    totals[split].add(label, moments, digest)
    finally:
        for writer in writers.values():
            writer.close()
    splits = {s: totals[s].record(f"{s}.tfrecord") for s in SPLITS if s in writers}
    return {"format": PARTITION_FORMAT, "partition": partition, "source": snapshot.cfg.source,
            "image_shape": list(snapshot.shape), "attempted": attempted,
            "rejected": rejected, "splits": splits,
            "files": list_files(into, skip=lambda p: p.name == RECORD)}


def _shard_png(data: bytes, image: Any) -> bytes:
    """The PNG a shard holds: the landed bytes when they already are an 8-bit PNG of the
    staged shape and channels (decoding them gives ``image``), else ``image`` encoded."""
    from PIL import Image

    height, width, channels = image.shape
    with Image.open(io.BytesIO(data)) as landed:  # reads the header only
        if (landed.format == "PNG" and landed.mode == MODES[channels]
                and landed.size == (width, height) and not landed.info.get("transparency")):
            return data
    return _png(image)


def _png(image: Any) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(
        out, format="PNG", compress_level=1)
    return out.getvalue()


def _moments(image: Any) -> tuple[int, list[int], list[int]]:
    """Pixel count and per-channel sums and sums of squares, exact (Python ints)."""
    import numpy as np

    pixels = image.reshape(-1, image.shape[-1]).astype(np.int64)
    return (len(pixels), [int(v) for v in pixels.sum(0)],
            [int(v) for v in (pixels * pixels).sum(0)])


def _example(png: bytes, label: str, key: str) -> bytes:
    import tensorflow as tf

    def feature(value: bytes) -> Any:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    return tf.train.Example(features=tf.train.Features(feature={
        "image": feature(png), "label": feature(label.encode()), "key": feature(key.encode()),
    })).SerializeToString()
