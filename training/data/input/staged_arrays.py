"""A staged dataset read back as NumPy arrays, without TensorFlow.

Why: Keras's JAX backend trains in a process that must never import ``tensorflow`` or
``tensorflow_datasets`` (their start-up, memory and device claims are not that
process's), yet the staged datasets are tfds's TFRecord shards and a team's snapshot
shards (``snapshot/staging.py``, ``snapshot/own_snapshot.py``). ``StagedArrays`` reads
both with the standard library (``records.py``, ``staged_layouts.py``) and Pillow, and
yields exactly the examples and labels that the tf.data reader
(``snapshot_reader.staged_builder`` + ``tf_reader``'s ``undecoded``) yields, **in the
same order** (``read_order.py``): a tfds split through tfds's interleave of its shards,
a snapshot one record of each day's shard in turn, a percent slice as tfds and
``SnapshotReader`` take it.

* ``StagedArrays(staged)``: ``name``, ``info`` (image shape, classes, examples per
  split: no tfds; ``splits.split_names(arrays, fraction)`` works on it as on a tfds
  builder), ``num_examples(split)``;
* ``encoded(split)`` / ``iter_encoded(split)``: the encoded images (PNG, or JPEG where
  tfds stored that) and int64 labels, for a pipeline that decodes per batch;
* ``arrays(split)``: the whole split decoded, ``(uint8 images (N, H, W, C), int64
  labels (N,))``; ``decode_images(encoded, shape)``: decoding alone, in threads.

Staging checks every shard's SHA-256 (``staging.verify``) before training; this module
reads what is there. Decoded pixels equal TensorFlow's for PNG (every team snapshot,
and mnist, cifar10 and the like), and for a JPEG whose components share one sampling
(grayscale, 4:4:4). A color JPEG with subsampled chroma (what tfds writes for a
``jpeg`` Image) is decoded as TensorFlow's ``dct_method="INTEGER_ACCURATE"`` decodes
it, not as tfds's default fast IDCT: a few levels apart on many pixels (measured: mean
2, at most 14, on quality-95 images). ``_not_subsampled`` says why. An image stored
with other channels than the dataset's is converted by Pillow, whose RGB-to-gray
weights are not libpng's; tfds and ``partition_shards`` always store the dataset's.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from training.data.input import read_order
from training.data.input.staged_layouts import StagedInfo, open_layout
from training.errors import DatasetError, shown

__all__ = ["StagedArrays", "StagedInfo", "decode_images"]

MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}  # channels -> Pillow mode
FORMATS = ("PNG", "JPEG")  # what tfds and partition_shards store
EIGHT_BIT = {"1", "L", "LA", "P", "PA", "RGB", "RGBA"}  # modes converted as TF converts
DECODE_CHUNK = 256  # images per thread task: small images cost more in dispatch


class StagedArrays:
    """A staged dataset (a ``staging.StagedDataset``, or its directory) read as arrays;
    its layout (tfds's or a snapshot's, ``staged_layouts.py``) is read once, here."""

    def __init__(self, staged: Any) -> None:
        self.path = Path(getattr(staged, "path", staged))
        self._layout = open_layout(self.path)
        self.info: StagedInfo = self._layout.info
        self.name = self.info.name

    def num_examples(self, split: str) -> int:
        return self._slice(split).count

    def _slice(self, split: str) -> read_order.SplitSlice:
        return read_order.parse_split(split, self.info.splits,
                                      f"dataset {self.name} at {self.path}")

    def iter_encoded(self, split: str) -> Iterator[tuple[bytes, int]]:
        """``(encoded image, label)`` of a split, in the tf.data reader's order."""
        return self._layout.examples(self._slice(split))

    def encoded(self, split: str) -> tuple[list[bytes], np.ndarray]:
        """A split's encoded images and int64 labels, in the tf.data reader's order."""
        images, labels = [], []
        for image, label in self.iter_encoded(split):
            images.append(image)
            labels.append(label)
        return images, np.asarray(labels, dtype=np.int64)

    def arrays(self, split: str, workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A whole split decoded: uint8 images ``(N, *image_shape)`` and int64 labels."""
        images, labels = self.encoded(split)
        return self.decode(images, workers, split), labels

    def decode(self, encoded: Sequence[bytes], workers: int | None = None,
               split: str = "") -> np.ndarray:
        """``decode_images`` at this dataset's shape."""
        what = f"dataset {self.name} at {self.path}" + (f", split {split}" if split else "")
        return decode_images(encoded, self.info.image_shape, workers=workers, what=what)


def decode_images(encoded: Sequence[bytes], shape: Sequence[int], *,
                  workers: int | None = None, what: str = "images") -> np.ndarray:
    """Encoded PNG/JPEG images -> one uint8 array ``(N, height, width, channels)``,
    decoded by Pillow (which releases the GIL while it decodes) in ``workers`` threads
    (default: the CPUs this process may run on). ``DatasetError`` names the image (its
    index in ``encoded``) that is unreadable, of another size or not 8-bit."""
    height, width, channels = (int(d) for d in shape)
    if channels not in MODES:
        raise DatasetError(f"{what}: images of {channels} channels cannot be decoded; "
                           f"channels must be one of {sorted(MODES)}")
    out = np.empty((len(encoded), height, width, channels), dtype=np.uint8)
    starts = range(0, len(encoded), DECODE_CHUNK)
    if len(starts) <= 1 or workers == 1:
        for start in starts:
            _decode_into(out, encoded, start, (height, width, channels), what)
        return out
    with ThreadPoolExecutor(max_workers=workers or cpus(),
                            thread_name_prefix="decode") as pool:
        for _ in pool.map(lambda s: _decode_into(out, encoded, s, (height, width, channels),
                                                 what), starts):
            pass  # a failed chunk raises here
    return out


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))  # a container's CPU set, not the host's
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _decode_into(out: np.ndarray, encoded: Sequence[bytes], start: int,
                 shape: tuple[int, int, int], what: str) -> None:
    from PIL import Image, UnidentifiedImageError

    height, width, channels = shape
    mode = MODES[channels]
    for index in range(start, min(start + DECODE_CHUNK, len(encoded))):
        try:
            with Image.open(io.BytesIO(encoded[index]), formats=FORMATS) as image:
                if image.format == "JPEG" and _not_subsampled(image):
                    image.decoderconfig = (1, 1)  # TF's default: the fast integer IDCT
                if image.size != (width, height):
                    raise DatasetError(f"{what}: image {index} is {image.size[0]}x"
                                       f"{image.size[1]} pixels, the dataset's images are "
                                       f"{width}x{height} (width x height)")
                if image.mode != mode:
                    if image.mode not in EIGHT_BIT:
                        raise DatasetError(f"{what}: image {index} is of Pillow mode "
                                           f"{image.mode}; the dataset's images are 8-bit "
                                           f"{mode}")
                    image = image.convert(mode)
                out[index] = np.asarray(image).reshape(shape)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise DatasetError(f"{what}: image {index} cannot be decoded ({shown(exc)}); "
                               f"images must be {' or '.join(FORMATS)}") from None


def _not_subsampled(image: Any) -> bool:
    """Whether a JPEG's components all have one sampling (grayscale, 4:4:4). Then
    Pillow's draft decoding (libjpeg's fast integer IDCT, no "fancy" upsampling, of
    which there is nothing to do) is TensorFlow's default ``decode_image`` exactly.
    With subsampled chroma, TensorFlow's default is the fast IDCT *and* fancy
    upsampling, a pair that Pillow does not offer; its default (accurate IDCT, fancy
    upsampling) is TensorFlow's ``INTEGER_ACCURATE`` exactly, and the nearer."""
    return len({tuple(layer[1:3]) for layer in getattr(image, "layer", [])}) <= 1
