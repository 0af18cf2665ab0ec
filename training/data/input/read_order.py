"""The order in which the tf.data reader yields a staged split, reproduced in Python.

``staged_arrays.py`` reads a staged dataset without TensorFlow and must give the
examples in the very order ``tf_reader``'s ``undecoded`` gives them
(``shuffle_files=False``), so that a seed means one order on either backend. That order
comes from three rules, each reproduced here and tested against tf.data
(``tests/unit/test_staged_arrays.py``):

* **A split expression** (``parse_split``): ``train``, or a whole-percent slice as
  ``snapshot/splits.split_names`` writes it (``train[:90%]``, ``train[90%:]``, also
  ``train[10%:20%]``), a bound being ``round(count * percent / 100)`` (Python's
  rounding, as tfds's ``_pct_to_abs_closest`` and ``SnapshotReader`` have it).
* **A tfds dataset** (``tfds_shard_reads`` + ``interleave``): the slice becomes a
  ``(shard, skip, take)`` per shard it touches (tfds's ``get_file_instructions``), and
  those shards are interleaved as tfds's reader does with tf_reader.py's ``ReadConfig``:
  ``cycle_length`` 16 (1 for a dataset that disables shuffling, whose order is the
  files' order), ``block_length`` 16, deterministic. The slice is taken *before* the
  interleave, per file.
* **A team's snapshot** (``interleave`` + ``islice``): ``SnapshotReader`` interleaves
  all the split's shards, one record of each in turn (``cycle_length`` = the number
  of shards, ``block_length`` 1), and slices the interleaved stream *after*.

``interleave`` follows tf.data's ``interleave`` (sequential, and parallel with
``deterministic=True``, which yields the same order): ``cycle_length`` slots, each
taking up to ``block_length`` elements in turn; an exhausted source frees its slot,
which the next source fills when the cycle comes back to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from training.errors import DatasetError

T = TypeVar("T")

# tfds's defaults, as tf_reader's undecoded ReadConfig leaves them (ReadConfig's
# interleave_block_length; reader._get_default_interleave_cycle_length). A test checks
# them against the installed tensorflow-datasets.
TFDS_CYCLE_LENGTH = 16
TFDS_ORDERED_CYCLE_LENGTH = 1  # a dataset with disable_shuffling: files in order
TFDS_BLOCK_LENGTH = 16

_EXPRESSION = re.compile(r"^(\w+)(?:\[(?:(\d+)%)?:(?:(\d+)%)?\])?$")


@dataclass(frozen=True)
class SplitSlice:
    """Examples ``start`` (included) to ``end`` (excluded) of split ``split``."""

    split: str
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def parse_split(expression: str, sizes: Mapping[str, int], what: str) -> SplitSlice:
    """``train[:90%]`` over ``sizes`` (examples per split) -> the examples it means;
    ``DatasetError`` naming ``what`` (the dataset) for anything else."""
    match = _EXPRESSION.match(expression.replace(" ", ""))
    if not match or match.group(1) not in sizes:
        raise DatasetError(
            f"{what} has no split {expression!r}: a split is one of {sorted(sizes)}, or a "
            "whole-percent slice of one as 'train[:90%]' or 'train[90%:]'")
    name, low, high = match.groups()
    count = sizes[name]
    for percent in (low, high):
        if percent is not None and int(percent) > 100:
            raise DatasetError(f"{what}: split {expression!r} asks for {percent}%, "
                               "a slice's percents are 0 to 100")
    start = 0 if low is None else round(count * int(low) / 100)
    end = count if high is None else round(count * int(high) / 100)
    return SplitSlice(name, start, max(start, end))


def tfds_shard_reads(shard_lengths: Sequence[int], start: int,
                     end: int) -> list[tuple[int, int, int]]:
    """``(shard index, records to skip, records to take)`` of every shard holding
    examples ``start:end`` of a split, in shard order (tfds's ``get_file_instructions``:
    empty shards and shards outside the slice are not read at all)."""
    reads, first = [], 0
    for index, length in enumerate(shard_lengths):
        if not length:
            continue
        last = first + length
        if start < last and end > first:
            skip = max(0, start - first)
            take = min(end, last) - first - skip
            if take:
                reads.append((index, skip, take))
        first = last
    return reads


def interleave(sources: Iterable[Iterable[T]], cycle_length: int,
               block_length: int) -> Iterator[T]:
    """tf.data's ``interleave`` order over ``sources`` (see the module doc)."""
    if cycle_length < 1 or block_length < 1:
        raise ValueError(f"cycle_length and block_length must be at least 1, got "
                         f"{cycle_length} and {block_length}")
    pending = iter(sources)
    slots: list[Iterator[T] | None] = [None] * cycle_length
    exhausted, open_slots, slot, taken = False, 0, 0, 0
    done = object()
    while not exhausted or open_slots:
        source = slots[slot]
        if source is not None:
            item = next(source, done)
            if item is not done:
                yield item
                taken += 1
                if taken == block_length:
                    slot, taken = (slot + 1) % cycle_length, 0
                continue
            slots[slot] = None  # exhausted: the slot is free, the cycle moves on
            open_slots -= 1
        elif not exhausted:
            nxt = next(pending, done)
            if nxt is done:
                exhausted = True
            else:
                slots[slot] = iter(nxt)
                open_slots += 1
            continue
        slot, taken = (slot + 1) % cycle_length, 0
