"""The input's one decision: which reader serves a run's splits, made once, as Keras's
``get_data_adapter`` decides once which adapter serves what ``fit`` was given.

Why one module decides: a staged dataset's files are read by one of three readers, each
with its own input reader behind one interface (``Reader``):

=====================================  ==================  ===========================
the files' reader (``load_builder``)    Keras backend       the input reader
=====================================  ==================  ===========================
tfds's builder of the directory         TensorFlow          ``tf_reader.TfReader``
``snapshot_reader.SnapshotReader``      TensorFlow          ``tf_reader.SnapshotTfReader``
``staged_arrays.StagedArrays``          JAX (no TF)         ``numpy_reader.NumpyReader``
=====================================  ==================  ===========================

``load_builder`` picks the files' reader for this process's backend, ``reader_for`` the
input reader for it: the one place that tests which kind of reader it holds
(``tests/unit/test_architecture.py`` keeps it so). Nothing else branches on the kind.

``training_input`` is what ``fit.train`` asks, once: the training and validation splits
as Keras's ``fit`` takes them, with what else training needs of the input. The
functions on a builder (``make_dataset``, ``split_size``, ``decoded_bytes``,
``undecoded``) are the same decision for a caller that holds one (evaluation, the
benchmarks, the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from training.data.snapshot.splits import split_names

if TYPE_CHECKING:
    from training.config import DatasetConfig


class Reader(Protocol):
    """What every input reader answers, whatever reads its files."""

    builder: Any  # the reader of the staged files it reads through
    name: str

    def size(self, split: str) -> int | None:
        """The examples of ``split`` (a slice expression included), when known."""

    def decoded_bytes(self, split: str) -> int | None:
        """The split's size once decoded (what ``dataset.input_cache`` weighs)."""

    def model_info(self) -> dict[str, Any]:
        """``{"input_shape", "num_classes"}`` for the model builder."""

    def image_shape(self) -> tuple[int, ...]:
        """The dataset's one image shape."""

    def label_names(self) -> list[str]:
        """The class names, by label index."""

    def dataset(self, split: str, *, global_batch_size: int, shuffle: bool, seed: int,
                shuffle_buffer: int = 10_000, cache: str = "auto", augment: str = "none",
                on_device: bool = False, decoded: bool = False) -> Any:
        """The split's batches as Keras's ``fit`` and ``evaluate`` take them."""

    def kept_on_device(self, dataset: Any) -> Any:
        """The ``device_split.DeviceSplit`` that ``dataset`` is fed from, or None."""


@dataclass(frozen=True)
class TrainingInput:
    """What ``fit.train`` gets back: the splits for ``model.fit`` and the rest it needs."""

    train: Any
    validation: Any
    train_examples: int | None  # the training split's size (the throughput's images)
    model_info: dict[str, Any]  # the model's input shape and classes
    device_split: Any  # the training split on the device (``fused_steps``), or None


def load_builder(staged: Any) -> Any:
    """The reader of a staged dataset's files for this process's Keras backend: a JAX
    process's reads them without TensorFlow (``staged_arrays.StagedArrays``: the same
    examples in the same order); a TensorFlow process's is a tfds-style builder
    (``snapshot_reader.staged_builder``). ``staged``: a ``staging.StagedDataset``."""
    from training import backend

    if backend.imported() == "jax":  # no TensorFlow in this process
        from training.data.input.staged_arrays import StagedArrays

        return StagedArrays(staged)
    from training.data.snapshot.snapshot_reader import staged_builder

    return staged_builder(staged)


def reader_for(builder: Any) -> Reader:
    """The input reader of ``builder`` (a reader of the files, ``load_builder``'s)."""
    from training.data.input.staged_arrays import StagedArrays
    from training.data.snapshot.snapshot_reader import SnapshotReader

    if isinstance(builder, StagedArrays):  # a JAX process
        from training.data.input.numpy_reader import NumpyReader

        return NumpyReader(builder)
    from training.data.input.tf_reader import SnapshotTfReader, TfReader

    if isinstance(builder, SnapshotReader):  # a team's snapshot
        return SnapshotTfReader(builder)
    return TfReader(builder)


def open_reader(staged: Any) -> Reader:
    """The input reader of a staged dataset, in this process."""
    return reader_for(load_builder(staged))


def training_input(staged: Any, data: DatasetConfig, *, global_batch_size: int, seed: int,
                   on_device: bool) -> TrainingInput:
    """The training split (shuffled, augmented, on the device when ``on_device`` and it
    fits) and the validation split of ``staged``, with ``data``'s settings."""
    reader = open_reader(staged)
    splits = split_names(reader.builder, data.validation_fraction)
    train = reader.dataset(splits["train"], global_batch_size=global_batch_size,
                           shuffle=True, seed=seed, shuffle_buffer=data.shuffle_buffer,
                           cache=data.input_cache, augment=data.augment,
                           on_device=on_device, decoded=data.decoded_copy)
    validation = reader.dataset(splits["validation"], global_batch_size=global_batch_size,
                                shuffle=False, seed=seed, cache=data.input_cache,
                                decoded=data.decoded_copy)
    return TrainingInput(train=train, validation=validation,
                         train_examples=reader.size(splits["train"]),
                         model_info=reader.model_info(),
                         device_split=reader.kept_on_device(train))


def make_dataset(builder: Any, split: str, **settings: Any) -> Any:
    """``split`` of ``builder`` as Keras takes it (``Reader.dataset``'s settings)."""
    return reader_for(builder).dataset(split, **settings)


def split_size(builder: Any, split: str) -> int | None:
    """The examples of ``split`` (a slice expression included), when the reader says."""
    return reader_for(builder).size(split)


def decoded_bytes(builder: Any, split: str) -> int | None:
    """The split's size once decoded (examples x image bytes + labels); None when the
    dataset's info does not say."""
    return reader_for(builder).decoded_bytes(split)


def undecoded(builder: Any, split: str) -> tuple[Any, Any]:
    """A TensorFlow process's encoded ``(image, label)`` records of ``split``, in order,
    and the function that decodes one (``tf_reader.TfReader.undecoded``)."""
    return reader_for(builder).undecoded(split)
