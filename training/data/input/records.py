"""TFRecord files and protocol buffer records, read and written in pure Python.

A JAX training process must not import TensorFlow (``staged_arrays.py`` says why), yet
every staged dataset is TFRecord shards of ``tf.train.Example`` records, and its
TensorBoard log is TFRecord files of ``Event`` records (``callbacks/epoch_scalars.py``).
This module reads and writes both by hand, with the standard library only (no
TensorFlow, no protobuf):

* **framing** (``iter_records``, ``frame``): each record is a uint64 little-endian
  length, a uint32 masked CRC-32C of the length, the data, and a uint32 masked CRC-32C
  of the data. ``frame`` computes the CRCs (``crc32c``, pure Python: a few records of
  a log). Reading does **not** check them: CRC-32C in pure Python is slow over whole
  shards, and the SHA-256 of every shard is checked against the staging manifest by
  ``staging.verify`` before training reads it, which catches more than a CRC would. A
  file that ends inside a record is a ``DatasetError`` naming the file and the byte.
* **protocol buffer fields** (``varint``, ``field``): the wire format's encoding, for
  the records this project writes (an ``Event``, a benchmark's ``Example``).
* **Example** (``parse_example``): the protocol buffer wire format decoded by hand,
  ``Example{features=1: Features{feature=1: map<string, Feature>}}``, ``Feature``
  being one of ``bytes_list=1``, ``float_list=2``, ``int64_list=3``, each a
  ``repeated value=1`` (int64 and float packed or not). Unknown fields are skipped, as
  protobuf does; a later map entry with the same key wins, as protobuf does.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from training.errors import DatasetError

_HEADER = struct.Struct("<Q4x")  # length, then its masked CRC (skipped)
_FOOTER = 4  # the data's masked CRC (skipped)
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_KINDS = {1: "bytes_list", 2: "float_list", 3: "int64_list"}
_INT64_WRAP = 1 << 64
_INT64_MAX = (1 << 63) - 1

Feature = list[bytes] | list[float] | list[int]


def iter_records(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """Every record of the TFRecord file at ``path``, in order (CRCs not checked: see
    the module doc). The file is memory-mapped: only the record being read is copied."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                return
            view = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise DatasetError(f"TFRecord file {path} cannot be read: {exc.strerror or exc}; "
                           "stage the dataset again") from None
    try:
        offset = 0
        while offset < size:
            if offset + _HEADER.size > size:
                raise _truncated(path, offset, _HEADER.size, size)
            (length,) = _HEADER.unpack_from(view, offset)
            start = offset + _HEADER.size
            end = start + length
            if end + _FOOTER > size:
                raise _truncated(path, offset, _HEADER.size + length + _FOOTER, size)
            yield view[start:end]
            offset = end + _FOOTER
    finally:
        view.close()


def _truncated(path: Path, offset: int, needed: int, size: int) -> DatasetError:
    return DatasetError(f"TFRecord file {path} is truncated: the record at byte {offset} "
                        f"needs {needed} bytes, the file has {size - offset} left; stage "
                        "the dataset again")


def parse_example(data: bytes) -> dict[str, Feature]:
    """A serialized ``tf.train.Example`` -> ``{feature name: its values}``: a list of
    bytes, of floats or of ints (the feature's kind; an empty Feature gives ``[]``).
    ``DatasetError`` when ``data`` is not one."""
    try:
        features: dict[str, Feature] = {}
        for field, wire, value in _fields(data, 0, len(data)):
            if field == 1 and wire == _LEN:  # Example.features
                start, end = value
                for f_field, f_wire, entry in _fields(data, start, end):
                    if f_field == 1 and f_wire == _LEN:  # Features.feature map entry
                        key, values = _map_entry(data, *entry)
                        features[key] = values
        return features
    except (IndexError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise DatasetError(f"a record is not a tf.train.Example ({exc}); the records "
                           "must be serialized tf.train.Example protocol buffers") from None


def _map_entry(data: bytes, start: int, end: int) -> tuple[str, Feature]:
    """``map<string, Feature>`` entry: key=1, value=2."""
    key, feature = "", (start, start)
    for field, wire, value in _fields(data, start, end):
        if field == 1 and wire == _LEN:
            key = bytes(data[value[0]:value[1]]).decode("utf-8")
        elif field == 2 and wire == _LEN:
            feature = value
    return key, _feature(data, *feature)


def _feature(data: bytes, start: int, end: int) -> Feature:
    """A ``Feature``: the values of its one list (of the last kind set; protobuf merges
    repeats of one kind, so their values add up)."""
    kind, values = None, []
    for field, wire, value in _fields(data, start, end):
        if field not in _KINDS or wire != _LEN:
            continue
        if field != kind:
            kind, values = field, []
        values += _list_values(data, field, *value)
    return values


def _list_values(data: bytes, kind: int, start: int, end: int) -> Feature:
    """The ``repeated value=1`` of a BytesList (1), FloatList (2) or Int64List (3)."""
    out: list = []
    for field, wire, value in _fields(data, start, end):
        if field != 1:
            continue
        if kind == 1 and wire == _LEN:
            out.append(bytes(data[value[0]:value[1]]))
        elif kind == 2 and wire == _LEN:  # packed floats
            a, b = value
            if (b - a) % 4:
                raise ValueError(f"packed floats of {b - a} bytes")
            out += struct.unpack_from(f"<{(b - a) // 4}f", data, a)
        elif kind == 2 and wire == _FIXED32:
            out.append(struct.unpack("<f", struct.pack("<I", value))[0])
        elif kind == 3 and wire == _LEN:  # packed varints
            a, b = value
            while a < b:
                number, a = _varint(data, a)
                out.append(_signed(number))
            if a != b:
                raise ValueError("packed int64 values overrun their field")
        elif kind == 3 and wire == _VARINT:
            out.append(_signed(value))
        else:
            raise ValueError(f"{_KINDS[kind]} value of wire type {wire}")
    return out


def _signed(number: int) -> int:
    number &= _INT64_WRAP - 1  # a varint is at most 64 bits; int64 is two's complement
    return number - _INT64_WRAP if number > _INT64_MAX else number


def _fields(data: bytes, pos: int, end: int) -> Iterator[tuple[int, int, object]]:
    """``(field number, wire type, value)`` of a message's fields in ``data[pos:end]``:
    the value an int (varint, fixed32, fixed64) or ``(start, end)`` (length-delimited)."""
    while pos < end:
        tag, pos = _varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _LEN:
            length, pos = _varint(data, pos)
            value = (pos, pos + length)
            pos += length
        elif wire == _FIXED32:
            value = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
        elif wire == _FIXED64:
            value = int.from_bytes(data[pos:pos + 8], "little")
            pos += 8
        else:
            raise ValueError(f"field {field} has wire type {wire} (groups are not used)")
        if pos > end:
            raise ValueError(f"field {field} runs past the end of its message")
        yield field, wire, value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The base-128 varint at ``pos`` and the position after it."""
    byte = data[pos]
    if byte < 0x80:  # most tags and lengths
        return byte, pos + 1
    result, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos + 1
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's CRC: CRC-32C rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One TFRecord frame of ``record``, as ``iter_records`` reads it back."""
    length = struct.pack("<Q", len(record))
    return (length + struct.pack("<I", masked_crc(length)) + record
            + struct.pack("<I", masked_crc(record)))


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protocol buffer base-128 varint."""
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, wire: int, payload: bytes) -> bytes:
    """Field ``number`` of wire type ``wire`` (0 varint, 1 fixed64, 2 length-delimited,
    5 fixed32) holding ``payload`` (already encoded; its length is added for type 2)."""
    key = varint(number << 3 | wire)
    return key + varint(len(payload)) + payload if wire == _LEN else key + payload
