"""The NumPy reader: a staged split as batches of NumPy arrays, in a JAX process.

``choose.py`` gives this reader a JAX process's ``staged_arrays.StagedArrays`` (tf.data
needs TensorFlow, which a JAX process never imports): the same examples, in the same
order, as the tf.data reader. ``NumpyReader.dataset`` serves a split on the device
when it fits there (the training split, ``device_split.kept``: its indices) and
otherwise from the host, as ``SplitBatches``, a ``keras.utils.PyDataset``:

* **why a PyDataset**: it ships with Keras and runs on every backend; Keras's JAX
  trainer takes its batches, prefetches them in threads (``workers``) and lays each
  batch out over the distribution's devices. NumPy arrays handed to ``fit`` would be
  shuffled by Keras with its own generator and could not decode lazily; grain is one
  more dependency (with native parts) for what a dozen lines do here.
* **cached** (``dataset.input_cache``, the same rule as tf.data's, ``memory.cache_plan``:
  the decoded split fits in a quarter of the memory available): decoded once, in
  parallel threads, then each batch is a slice of a per-epoch permutation.
* **not cached**: the encoded records stay in memory (a few kB an image) and each batch
  is decoded when it is asked for, ahead of the step, in a thread per CPU (Pillow
  releases the GIL while it decodes), with at most two batches a CPU, and 1 GiB, queued.
* **decoded copy** (``dataset.decoded_copy``, ``decoded_copy.py``): nothing is decoded.
  Cached, the split is read from it into memory; not cached, each batch is gathered
  from its memory map (the page cache holds what the disk gave), in the same threads.
  Not cached, nothing of the split stays in this process's memory.
* **shuffle**: a permutation drawn per epoch from ``(seed, epoch)``: a seed gives one
  order, a new one each epoch. Like the tf.data path, a resumed run starts the stream
  again (docs/resume.md).
* **augment**: ``flip`` and ``crop`` (reflect-padded by 1/8 of a side, then cropped),
  per image, drawn from ``(seed, epoch, batch)``.
* **several processes** (``jax.process_count()`` > 1): every process draws the same
  permutation and takes its own contiguous slice of each global batch, which Keras joins
  into one global array (``jax.make_array_from_process_local_data``). A global batch is
  cut to a multiple of the data-parallel devices (at most ``devices - 1`` examples of an
  epoch's last batch are left out, logged once), since each device takes an equal part
  (``device_split.batch_bounds``).
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np

from training.data.input.device_split import (
    batch_bounds,
    batch_count,
    data_devices,
    device_memory,
    kept,
    plan,
    processes,
)
from training.data.input.memory import LABEL_BYTES, available_memory, cache_plan
from training.data.input.staged_arrays import StagedArrays, cpus
from training.errors import DatasetError

log = logging.getLogger(__name__)

QUEUE_BYTES = 1 << 30  # the most the batches decoded ahead of the step may hold, except
# that two are always queued (double buffering): batches over 512 MiB queue 2 anyway


class NumpyReader:
    """A ``StagedArrays``'s splits as ``PyDataset`` batches (``choose.Reader``)."""

    def __init__(self, arrays: StagedArrays) -> None:
        self.builder, self.name = arrays, arrays.name

    def size(self, split: str) -> int:
        return self.builder.num_examples(split)

    def decoded_bytes(self, split: str) -> int:
        """The split's size once decoded (examples x image bytes + labels)."""
        shape = self.builder.info.image_shape
        return self.builder.num_examples(split) * (int(np.prod(shape)) + LABEL_BYTES)

    def model_info(self) -> dict[str, Any]:
        return self.builder.info.dataset_info()

    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.builder.info.image_shape)

    def label_names(self) -> list[str]:
        info = self.builder.info
        return list(info.label_names or [str(i) for i in range(info.num_classes)])

    def kept_on_device(self, dataset: Any) -> Any:
        """The split's ``device_split.DeviceSplit`` when it is there, else None."""
        return dataset.device_split

    def dataset(self, split: str, *, global_batch_size: int, shuffle: bool, seed: int,
                shuffle_buffer: int = 10_000, cache: str = "auto", augment: str = "none",
                on_device: bool = False, decoded: bool = False) -> Any:
        """One split's batches: with ``on_device`` (the training split) on the device
        when it fits there (``device_split.plan``), else ``SplitBatches`` of the module
        doc's stages (``shuffle_buffer`` is tf.data's: a permutation needs none).
        ``decoded`` (``dataset.decoded_copy``): the pixels are read from the split's
        decoded copy (``decoded_copy.py``), not decoded from the shards."""
        copy = None
        if decoded:
            from training.data.input import decoded_copy

            copy = decoded_copy.required(self.builder.path, split, self.name)
        again = ("read from its decoded copy every epoch" if copy
                 else "decoded again every epoch")
        if on_device:
            memory, what = device_memory()
            there, why = plan(self.decoded_bytes(split), cache=cache, augment=augment,
                              processes=processes()[1], memory=memory, what=what)
            log.info("input %s: %s (%s)", split, "kept on the device" if there else
                     "fed from the host", why)
            if there:
                images, labels = ((copy.images(), copy.labels) if copy
                                  else self.builder.arrays(split))
                return kept(images, labels, global_batch_size=global_batch_size,
                            shuffle=shuffle, seed=seed)
        keep, why = cache_plan(cache, self.decoded_bytes(split), available_memory(), again)
        log.info("input %s: %s (%s)", split, "cached in memory" if keep else "not cached",
                 why)
        return SplitBatches(self.builder, split, global_batch_size=global_batch_size,
                            shuffle=shuffle, seed=seed, keep_decoded=keep, decoded=copy,
                            augment=tuple(augment.split("_")) if augment != "none" else ())


class SplitBatches(keras.utils.PyDataset):
    """One split as ``(uint8 images, int32 labels)`` batches (see the module doc)."""

    device_split = None  # fed from the host (``device_split.IndexBatches`` has one)

    def __init__(self, reader: Any, split: str, *, global_batch_size: int, shuffle: bool,
                 seed: int, keep_decoded: bool, augment: tuple[str, ...] = (),
                 decoded: Any = None) -> None:
        workers, queue = 1, 8
        if not keep_decoded:  # a thread a CPU, the queue in QUEUE_BYTES (at least 2 batches)
            batch_bytes = global_batch_size * int(np.prod(reader.info.image_shape))
            queue = max(2, min(2 * cpus(), QUEUE_BYTES // max(1, batch_bytes)))
            workers = min(cpus(), queue)
        super().__init__(workers=workers, use_multiprocessing=False, max_queue_size=queue)
        self.reader, self.split, self.seed = reader, split, seed
        self.shuffle, self.augment = shuffle, augment
        self.global_batch_size = global_batch_size
        self.devices = data_devices()
        self.process, self.processes = processes()
        if decoded is not None:  # a decoded_copy.DecodedSplit: read, not decoded
            self.images = np.array(decoded.images()) if keep_decoded else decoded.images()
            self.labels, self.encoded = decoded.labels, None
        elif keep_decoded:
            self.images, self.labels = reader.arrays(split)
            self.encoded = None
        else:
            self.encoded, self.labels = reader.encoded(split)
            self.images = None
        self.labels = self.labels.astype(np.int32)  # JAX's default integer width
        if not len(self.labels):
            raise DatasetError(f"split {split!r} of dataset {reader.name} has no examples")
        if global_batch_size % self.devices:
            raise DatasetError(f"the global batch {global_batch_size} does not divide over "
                               f"the {self.devices} data-parallel devices")
        self.epoch = 0
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        return batch_count(len(self.labels), self.global_batch_size, self.devices)

    def order(self) -> np.ndarray:
        """This epoch's order of the split's examples."""
        if self._order is None:
            count = len(self.labels)
            self._order = (np.random.default_rng([self.seed, self.epoch]).permutation(count)
                           if self.shuffle else np.arange(count))
        return self._order

    def on_epoch_end(self) -> None:
        self.epoch += 1
        self._order = None

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = batch_bounds(index, len(self.labels), self.global_batch_size,
                                  self.devices)
        rows = self.order()[start:end]
        share = len(rows) // self.processes
        rows = rows[self.process * share:(self.process + 1) * share]
        if self.images is not None:
            images = np.ascontiguousarray(self.images[rows])  # a memory map: a copy
        else:
            images = self.reader.decode([self.encoded[i] for i in rows], workers=1,
                                        split=self.split)
        if self.augment:
            images = augmented(images, self.augment,
                               np.random.default_rng([self.seed, self.epoch, index]))
        return images, self.labels[rows]


def augmented(images: np.ndarray, ops: tuple[str, ...], rng: np.random.Generator) -> np.ndarray:
    """``images`` (N, H, W, C) with each randomly flipped left-right and/or cropped from
    its reflect-padded copy (padding 1/8 of a side, at least 1 pixel)."""
    images = images.copy()
    count, height, width = images.shape[:3]
    if "flip" in ops:
        flip = rng.random(count) < 0.5
        images[flip] = images[flip, :, ::-1]
    if "crop" in ops:
        pad_h = 0 if height < 2 else max(1, height // 8)
        pad_w = 0 if width < 2 else max(1, width // 8)
        padded = np.pad(images, ((0, 0), (pad_h, pad_h), (pad_w, pad_w), (0, 0)),
                        mode="reflect")
        tops = rng.integers(0, 2 * pad_h + 1, count)
        lefts = rng.integers(0, 2 * pad_w + 1, count)
        for i in range(count):
            images[i] = padded[i, tops[i]:tops[i] + height, lefts[i]:lefts[i] + width]
    return images
