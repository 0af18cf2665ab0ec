"""A staged dataset's splits kept decoded on disk: pixels read, not images decoded.

Why: a model that is heavy per image (a backbone at 224x224) on an accelerator needs
thousands of images a second, and decoding PNGs costs about 3 ms of a core each
(measured: 16 cores decode about 4,946 224x224 PNGs a second, less than the 5,893 a
second an H200 trains ResNet-50 at; docs/benchmarks.md). When the split does not fit
in memory, every epoch decodes it again. With ``dataset.decoded_copy``, staging decodes
each split once (on the staging worker's CPUs, not the training pod's) into one file of
fixed-size records, and training reads pixels from it: a NumPy memory map in a JAX
process (``DecodedSplit.images``, served by ``numpy_reader``), and
``tf.data.FixedLengthRecordDataset`` under TensorFlow (``tf_reader.copy_records``, in
that reader's stages). This module is the source of those pixels, not a reader of
either backend. Reading is a copy out of the page cache, in any order; the cost is
disk, H x W x C bytes an image (a 224x224 photo is about 100 kB as PNG, 147 kB here).

Layout, in the staged dataset's directory beside its shards, but outside its manifest
and fingerprint (a copy derived from the content, not content)::

    decoded/index.json      what is here, written last (after every file is complete)
    decoded/<stem>.pixels   count x H x W x C uint8, row-major, in the reader's order
    decoded/<stem>.labels   count little-endian int64

``index.json``: ``{"format": 1, "fingerprint": <the staged dataset's>, "splits":
{<split expression>: {"stem", "count", "shape", "pixels": {"size", "sha256"},
"labels": {"size", "sha256"}}}}``. Each training split expression (``train[:90%]``)
has its own pair of files, written in the order the readers read it
(``staged_arrays.StagedArrays``, the same order as tf.data's).

* ``ensure`` (the stage step, when ``dataset.decoded_copy`` is true) writes what is
  missing, under the staging lock; an index of another fingerprint is stale and
  written again.
* ``find`` (the input's readers, through ``required``) checks a split's files' size
  and SHA-256 against the index and gives a ``DecodedSplit``; a changed byte is a
  ``DatasetError`` naming the file and how to fix it. A process hashes a file once
  while its inode, size and change time stay the same (a run's train, validation and
  test inputs open the same files more than once).
* Every file is written beside its place (``.tmp``), synced, and renamed over it: a
  process still reading a stale copy through a memory map keeps the old file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.errors import DatasetError
from training.files import replace_file, sha256_file
from training.layout import STAGING_MANIFEST

log = logging.getLogger(__name__)

FORMAT = 1
FOLDER = "decoded"
INDEX = "index.json"
WRITE_BYTES = 1 << 30  # at most this many decoded bytes held while writing a split
LOCK_WAIT_S = 1800.0  # staging's own wait for the same lock


@dataclass(frozen=True, eq=False)
class DecodedSplit:
    """One split's decoded copy, checked: where its pixels are, its labels, its shape."""

    pixels: Path
    labels: np.ndarray  # int64, (count,)
    shape: tuple[int, int, int]

    @property
    def count(self) -> int:
        return len(self.labels)

    @property
    def image_bytes(self) -> int:
        return int(np.prod(self.shape))

    def images(self) -> np.ndarray:
        """The pixels as a read-only memory map ``(count, H, W, C)``: nothing is read
        until an image is indexed (the JAX input's reader)."""
        return np.memmap(self.pixels, dtype=np.uint8, mode="r",
                         shape=(self.count, *self.shape))


def fingerprint_of(staged_path: Path) -> str:
    """The staged dataset's fingerprint, from its manifest (no tfds, no staging import)."""
    try:
        return str(json.loads((staged_path / STAGING_MANIFEST).read_text())["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"dataset at {staged_path} has no readable "
                           f"{STAGING_MANIFEST} ({exc}): stage it first") from None


def read_index(staged_path: Path) -> dict[str, Any] | None:
    """The decoded copy's index if there is one of this format and of the staged
    dataset's current fingerprint; None if there is none or it is stale."""
    path = staged_path / FOLDER / INDEX
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DatasetError(f"decoded copy index {path} is unreadable ({exc}); delete "
                           f"{path.parent} and stage again") from None
    if index.get("format") != FORMAT or index.get("fingerprint") != fingerprint_of(staged_path):
        return None
    return index


def missing(staged_path: Path, splits: Iterable[str]) -> list[str]:
    """The split expressions that have no decoded copy yet (no hashing: cheap)."""
    index = read_index(staged_path) or {"splits": {}}
    return [split for split in splits if split not in index["splits"]]


def ensure(path: Path, splits: Iterable[str]) -> list[str]:
    """Write the decoded copy of the split expressions (those training reads:
    ``snapshot/splits.split_names``) that have none yet; the ones written."""
    from training.data.input.staged_arrays import StagedArrays
    from training.locks import claim

    splits = list(dict.fromkeys(splits))
    if not missing(path, splits):
        return []
    reader = StagedArrays(path)
    with claim(path.with_name(path.name + ".lock"), f"staging directory {path}",
               wait_s=LOCK_WAIT_S):
        index = read_index(path) or {"format": FORMAT, "fingerprint": fingerprint_of(path),
                                     "splits": {}}
        todo = [split for split in splits if split not in index["splits"]]
        for split in todo:
            index["splits"][split] = _write_split(reader, split, path / FOLDER)
            log.info("decoded copy of %s split %s: %d images, %.1f MB", reader.name, split,
                     index["splits"][split]["count"],
                     index["splits"][split]["pixels"]["size"] / 2**20)
        replace_file(path / FOLDER / INDEX,  # written last: the copy is complete
                     [json.dumps(index, indent=1, sort_keys=True).encode()])
    return todo


def _stem(split: str) -> str:
    base = split.split("[", 1)[0]
    return f"{base}-{hashlib.sha256(split.encode()).hexdigest()[:10]}"


def _write_split(reader: Any, split: str, folder: Path) -> dict[str, Any]:
    """Decode ``split`` into ``<stem>.pixels`` and ``<stem>.labels``, a chunk of images at
    a time: enough for every CPU's decoding thread, at most ``WRITE_BYTES`` of pixels."""
    from training.data.input.staged_arrays import DECODE_CHUNK, cpus, decode_images

    folder.mkdir(parents=True, exist_ok=True)
    stem = _stem(split)
    shape = [int(d) for d in reader.info.image_shape]
    size = max(1, min(DECODE_CHUNK * cpus(), WRITE_BYTES // int(np.prod(shape))))
    hashes = {"pixels": hashlib.sha256(), "labels": hashlib.sha256()}
    count = 0
    what = f"dataset {reader.name} at {reader.path}, split {split}"
    labels: list[bytes] = []

    def pixels() -> Iterable[bytes]:
        nonlocal count
        examples = iter(reader.iter_encoded(split))
        while chunk := list(itertools.islice(examples, size)):
            data = decode_images([image for image, _ in chunk], shape, what=what).tobytes()
            numbers = np.asarray([label for _, label in chunk], dtype="<i8").tobytes()
            hashes["pixels"].update(data)
            hashes["labels"].update(numbers)
            labels.append(numbers)
            count += len(chunk)
            yield data

    replace_file(folder / f"{stem}.pixels", pixels())
    replace_file(folder / f"{stem}.labels", labels)
    return {"stem": stem, "count": count, "shape": shape,
            **{name: {"size": (folder / f"{stem}.{name}").stat().st_size,
                      "sha256": digest.hexdigest()} for name, digest in hashes.items()}}


def required(staged_path: Path | None, split: str, name: str) -> DecodedSplit:
    """``find``, for a run with ``dataset.decoded_copy``: DatasetError when there is no
    copy of ``split`` (``name``: the dataset's, for the message)."""
    found = find(staged_path, split) if staged_path is not None else None
    if found is None:
        raise DatasetError(
            f"dataset.decoded_copy is true, but dataset {name} staged at {staged_path} has "
            f"no decoded copy of split {split!r}: stage it again with this config "
            "(python -m training stage), or set dataset.decoded_copy to false")
    return found


def find(staged_path: Path, split: str) -> DecodedSplit | None:
    """``split``'s decoded copy, its files checked against the index; None when the
    staged dataset has none for that split (or only a stale one)."""
    index = read_index(staged_path)
    entry = (index or {"splits": {}})["splits"].get(split)
    if entry is None:
        return None
    folder = staged_path / FOLDER
    for name in ("pixels", "labels"):
        path = folder / f"{entry['stem']}.{name}"
        if not path.is_file():
            raise DatasetError(f"decoded copy file {path} is missing (split {split}); "
                               f"delete {folder} and stage again")
        if not _matches(path, entry[name]["size"], entry[name]["sha256"]):
            raise DatasetError(
                f"decoded copy file {path} is corrupted: its size or SHA-256 does not match "
                f"{folder / INDEX} (split {split}); delete {folder} and stage again")
    labels = np.fromfile(folder / f"{entry['stem']}.labels", dtype="<i8").astype(np.int64)
    return DecodedSplit(folder / f"{entry['stem']}.pixels", labels,
                        tuple(int(d) for d in entry["shape"]))


_VERIFIED: set[tuple[Any, ...]] = set()  # (file state, expected size and digest) seen whole


def _matches(path: Path, size: int, digest: str) -> bool:
    """Whether ``path`` has ``size`` bytes hashing to ``digest``; hashed once while the
    file's device, inode, size and change time (any write changes it) stay the same."""
    stat = path.stat()
    key = (os.fspath(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_ctime_ns,
           size, digest)
    if key in _VERIFIED:
        return True
    if (stat.st_size, sha256_file(path)) != (size, digest):
        return False
    _VERIFIED.add(key)
    return True
