"""Statistics of a staged image-classification dataset: what ``validation.py`` checks.

``dataset_statistics(builder, splits)`` reads each split once, streaming (one image in
memory at a time, plus one 16-byte hash per example), and returns a JSON-serialisable
dict (``FORMAT`` 1)::

    {"format": 1,
     "label_names": ["cat", "dog"], "num_classes": 2,
     "image_shape": [8, 8, 1], "image_dtype": "uint8",
     "splits": {"train": {"split": "train[:90%]", "num_examples": 36,
                          "class_counts": [18, 18],        # by class index
                          "pixel_mean": [127.4], "pixel_std": [73.9],  # per channel, 0-255
                          "image_shape": [8, 8, 1], "image_dtype": "uint8"},
                "validation": {...}, "test": {...}},
     "duplicates": {"count": 1, "within_split": 0,
                    "examples": [[["train", 3], ["test", 0]]]}}

``duplicates`` compares a content hash per example (SHA-256 of the image's shape and
raw bytes): ``count`` is the number of examples whose exact image already appeared in
an earlier split (in the order of ``splits``), ``examples`` up to ``MAX_EXAMPLES`` of
them as pairs (first place seen, this place), a place being ``[split, index]`` with the
index in the split expression's reading order (``as_dataset``, files not shuffled).
``within_split`` counts repeats inside one split; they are not leakage.

A split whose images differ in shape (or a dataset whose splits do) is a
``DatasetError``: every statistic here assumes one image shape.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from training.errors import DatasetError

FORMAT = 1
MAX_EXAMPLES = 10
_HASH_BYTES = 16  # 128 bits per example: collisions are negligible, memory is halved


def content_hash(image: Any) -> bytes:
    """The identity of an image's content: SHA-256 of its shape and raw bytes."""
    import numpy as np

    array = np.ascontiguousarray(image)
    digest = hashlib.sha256(repr(tuple(array.shape)).encode())
    digest.update(array.tobytes())
    return digest.digest()[:_HASH_BYTES]


def label_names(builder: Any) -> list[str]:
    """The class names of a tfds-style builder's label feature (``"0"``, ``"1"``, ...
    without)."""
    info = builder.info
    keys = info.supervised_keys or ("image", "label")
    label = info.features[keys[1]]
    names = getattr(label, "names", None)
    return [str(n) for n in names] if names else [str(i) for i in range(label.num_classes)]


class _Moments:
    """Per-channel pixel sums, exact for integer images (Python ints, no rounding)."""

    def __init__(self) -> None:
        self.count = 0
        self.sums: list[Any] | None = None
        self.squares: list[Any] | None = None

    def add(self, image: Any) -> None:
        import numpy as np

        pixels = image.reshape(-1, image.shape[-1] if image.ndim == 3 else 1)
        kind = np.int64 if pixels.dtype.kind in "ui" else np.float64
        pixels = pixels.astype(kind)
        sums = [v.item() for v in pixels.sum(axis=0)]
        squares = [v.item() for v in (pixels * pixels).sum(axis=0)]
        if self.sums is None:
            self.sums, self.squares = sums, squares
        else:
            self.sums = [a + b for a, b in zip(self.sums, sums, strict=True)]
            self.squares = [a + b for a, b in zip(self.squares, squares, strict=True)]
        self.count += pixels.shape[0]

    def mean_std(self) -> tuple[list[float] | None, list[float] | None]:
        if not self.count or self.sums is None or self.squares is None:
            return None, None
        n = self.count
        means = [s / n for s in self.sums]
        # n*sum(x^2) - sum(x)^2 is exact in integers; the population std (ddof 0)
        stds = [math.sqrt(max(n * q - s * s, 0) / (n * n))
                for s, q in zip(self.sums, self.squares, strict=True)]
        return means, stds


def count_duplicate(digest: Any, place: tuple[str, int], seen: dict[Any, tuple[str, int]],
                    duplicates: dict[str, Any]) -> None:
    """Count the example at ``place`` (split, index) in ``duplicates`` when its content
    ``digest`` was seen before: in another split (leakage) or in its own."""
    first = seen.setdefault(digest, place)
    if first == place:
        return
    if first[0] == place[0]:
        duplicates["within_split"] += 1
        return
    duplicates["count"] += 1
    if len(duplicates["examples"]) < MAX_EXAMPLES:
        duplicates["examples"].append([list(first), list(place)])


def _shape_error(where: str, first: tuple[Any, str], other: tuple[Any, str]) -> DatasetError:
    return DatasetError(
        f"{where} holds images of different shapes: {list(first[0])} ({first[1]}) and "
        f"{list(other[0])} ({other[1]}); validation and training need one image shape: "
        "resize the images to one shape when staging them")


def _split_statistics(name: str, expression: str, examples: Iterable[tuple[Any, Any]],
                      num_classes: int, seen: dict[bytes, tuple[str, int]],
                      duplicates: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    counts = np.zeros(num_classes, dtype=np.int64)
    moments = _Moments()
    shape: tuple[Any, str] | None = None
    dtype = None
    index = -1
    for index, (image, label) in enumerate(examples):
        image = np.asarray(image)
        if shape is None:
            shape, dtype = (image.shape, f"index {index}"), str(image.dtype)
        elif image.shape != shape[0]:
            raise _shape_error(f"split {name!r} ({expression})", shape,
                               (image.shape, f"index {index}"))
        label = int(label)
        if not 0 <= label < num_classes:
            raise DatasetError(f"split {name!r} ({expression}) has label {label} at index "
                               f"{index}; the dataset has {num_classes} classes (0 to "
                               f"{num_classes - 1})")
        counts[label] += 1
        moments.add(image)
        count_duplicate(content_hash(image), (name, index), seen, duplicates)
    means, stds = moments.mean_std()
    return {"split": expression, "num_examples": index + 1,
            "class_counts": [int(c) for c in counts], "pixel_mean": means, "pixel_std": stds,
            "image_shape": None if shape is None else [int(d) for d in shape[0]],
            "image_dtype": dtype}


def dataset_statistics(builder: Any, splits: Mapping[str, str]) -> dict[str, Any]:
    """Statistics of every split (``{"train": "train[:90%]", ...}``, as
    ``splits.split_names`` gives them), one streaming pass each."""
    import tensorflow_datasets as tfds

    names = label_names(builder)
    seen: dict[bytes, tuple[str, int]] = {}
    duplicates: dict[str, Any] = {"count": 0, "within_split": 0, "examples": []}
    per_split = {}
    for name, expression in splits.items():
        dataset = builder.as_dataset(split=expression, as_supervised=True,
                                     shuffle_files=False)
        per_split[name] = _split_statistics(name, expression, tfds.as_numpy(dataset),
                                            len(names), seen, duplicates)
    shapes = [(s["image_shape"], f"split {n!r}") for n, s in per_split.items()
              if s["image_shape"] is not None]
    for other in shapes[1:]:
        if other[0] != shapes[0][0]:
            raise _shape_error(f"dataset {builder.name}", shapes[0], other)
    dtypes = {s["image_dtype"] for s in per_split.values() if s["image_dtype"]}
    return {
        "format": FORMAT,
        "label_names": names,
        "num_classes": len(names),
        "image_shape": shapes[0][0] if shapes else None,
        "image_dtype": ", ".join(sorted(dtypes)) or None,
        "splits": per_split,
        "duplicates": duplicates,
    }
