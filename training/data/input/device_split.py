"""A training split kept on the accelerator, fed by its indices (a JAX process).

At a small batch the card waits on the host: Keras's JAX ``fit`` copies every batch from
the host and runs ``steps_per_execution`` steps as a Python loop (docs/benchmarks.md).
When the decoded training split fits in a share of the device's memory (``DEVICE_SHARE``,
the same kind of rule as ``dataset.input_cache`` for the host's: the log says which way
it went and why), it is copied to the device once, and each epoch is an order of its
indices:

* ``plan`` decides; the split stays on the host (``numpy_reader.SplitBatches``) when
  it does not fit, when ``dataset.input_cache`` is ``none``, when it is augmented (the
  augmentations run on the host), or when several processes feed one mesh;
* ``DeviceSplit`` holds the images and labels on the devices of the distribution
  (replicated: each device gathers its part of every batch itself);
* ``IndexBatches`` is the ``PyDataset`` that ``fit`` iterates: each batch the indices
  of its examples, the epoch's order a permutation drawn on the device from
  ``(fit.seed, epoch)`` (on a CPU device, read through NumPy: a batch's indices then
  cost no dispatch). ``training.train.fused_steps`` turns a group of
  ``steps_per_execution`` of them into one compiled group that gathers each batch on the
  device.

``kept`` is what the NumPy reader calls when the split stays here: the split on the
devices, as its ``IndexBatches``. A global batch is cut to a multiple of the
data-parallel devices, on the host path too: how a batch divides over the devices
(``data_devices``, ``batch_count``, ``batch_bounds``, ``processes``) is here, and the
host's ``SplitBatches`` takes it from here.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np

log = logging.getLogger(__name__)

DEVICE_SHARE = 4  # the split stays on the device when it fits in 1/DEVICE_SHARE of it


def data_devices() -> int:
    """The devices a global batch is split over: the active distribution's data axis."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return 1
    mesh = distribution.device_mesh
    return int(mesh.shape[mesh.axis_names.index(distribution.batch_dim_name)])


def batch_count(examples: int, global_batch_size: int, devices: int) -> int:
    """Batches in an epoch of ``examples``: a last batch smaller than the devices (which
    cannot take an equal part each) is left out."""
    batches = -(-examples // global_batch_size)
    last = examples - (batches - 1) * global_batch_size
    return batches - (1 if last < devices else 0)


def batch_bounds(index: int, examples: int, global_batch_size: int,
                 devices: int) -> tuple[int, int]:
    """Where batch ``index`` starts and ends in the epoch's order, cut to a multiple of
    the devices (equal parts per device)."""
    start = index * global_batch_size
    end = min(start + global_batch_size, examples)
    return start, end - (end - start) % devices


def processes() -> tuple[int, int]:
    """(this process's index, the number of processes) of a JAX run."""
    import jax

    return jax.process_index(), jax.process_count()


def device_memory() -> tuple[int | None, str]:
    """Bytes the first local device may hold, and what they are: the accelerator's own
    memory (JAX's ``bytes_limit``), or for a CPU device the host's available memory."""
    import jax

    from training.data.input.memory import available_memory

    stats = jax.local_devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{jax.default_backend()} device memory"
    return available_memory(), "host memory (a CPU device)"


def plan(size: int | None, *, cache: str, augment: str, processes: int,
         memory: int | None, what: str) -> tuple[bool, str]:
    """Whether the decoded split (``size`` bytes) lives on the device, and why (logged)."""
    if cache == "none":
        return False, "dataset.input_cache is 'none'"
    if augment != "none":
        return False, f"dataset.augment {augment!r} runs on the host"
    if processes > 1:
        return False, "several processes feed one mesh: each reads its own slice"
    if size is None or memory is None:
        return False, "its size or the device's memory is unknown"
    budget = memory // DEVICE_SHARE
    fits = size <= budget
    return fits, (f"{size / 2**20:,.1f} MB decoded {'fits in' if fits else 'exceeds'} "
                  f"{budget / 2**20:,.1f} MB, a quarter of the {what}")


class DeviceSplit:
    """A decoded split on the distribution's devices (replicated), or JAX's default."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        import jax

        distribution = keras.distribution.distribution()
        if distribution is None:
            place = jax.devices()[0]
        else:
            mesh = distribution.device_mesh.backend_mesh
            place = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self.images = jax.device_put(images, place)
        self.labels = jax.device_put(labels.astype(np.int32), place)
        self.count = len(labels)
        self.platform = next(iter(self.images.devices())).platform  # cpu, gpu, tpu


class IndexBatches(keras.utils.PyDataset):
    """The batches of a ``DeviceSplit`` as the indices of their examples."""

    def __init__(self, split: DeviceSplit, *, global_batch_size: int, shuffle: bool,
                 seed: int) -> None:
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=4)
        self.device_split, self.shuffle, self.seed = split, shuffle, seed
        self.global_batch_size = global_batch_size
        self.devices = data_devices()
        self.epoch = 0
        self._order: Any = None

    def __len__(self) -> int:
        return batch_count(self.device_split.count, self.global_batch_size, self.devices)

    def order(self) -> Any:
        """This epoch's order of the split's examples, drawn on the device."""
        import jax

        if self._order is None:
            if self.shuffle:
                key = jax.random.fold_in(jax.random.key(self.seed), self.epoch)
                self._order = jax.random.permutation(key, self.device_split.count)
            else:
                self._order = jax.numpy.arange(self.device_split.count)
            if self.device_split.platform == "cpu":  # the host's memory: slicing it in
                self._order = np.asarray(self._order)  # NumPy costs no dispatch a batch
        return self._order

    def on_epoch_end(self) -> None:
        self.epoch += 1
        self._order = None

    def __getitem__(self, index: int) -> tuple[Any]:
        start, end = batch_bounds(index, self.device_split.count, self.global_batch_size,
                                  self.devices)
        return (self.order()[start:end],)


def kept(images: np.ndarray, labels: np.ndarray, *, global_batch_size: int, shuffle: bool,
         seed: int) -> IndexBatches:
    """A decoded split put on the devices, as the batches ``fit`` iterates."""
    return IndexBatches(DeviceSplit(images, labels), global_batch_size=global_batch_size,
                        shuffle=shuffle, seed=seed)
