"""``data.records``' writing half: TFRecord frames byte for byte as TensorFlow writes
them (so their CRCs are right), and protocol buffer fields as protobuf parses them."""

from __future__ import annotations

import struct

from training.data.input.records import field, frame, iter_records, parse_example, varint


def test_a_frame_is_what_tensorflow_writes_and_reads_back(tmp_path):
    import tensorflow as tf

    records = [b"", b"abc", bytes(range(256)) * 9]
    ours, theirs = tmp_path / "ours.tfrecord", tmp_path / "theirs.tfrecord"
    ours.write_bytes(b"".join(frame(r) for r in records))
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for record in records:
            writer.write(record)
    assert ours.read_bytes() == theirs.read_bytes()
    assert [bytes(r) for r in iter_records(ours)] == records
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(ours))] == records  # CRCs checked


def test_fields_encode_an_example_protobuf_parses():
    from tensorflow.core.example import example_pb2

    feature = field(1, 2, field(1, 2, b"png"))  # bytes_list.value
    label = field(3, 2, field(1, 2, varint(300)))  # int64_list (packed)
    entries = (field(1, 2, field(1, 2, b"image") + field(2, 2, feature))
               + field(1, 2, field(1, 2, b"label") + field(2, 2, label)))
    data = field(1, 2, entries)
    parsed = example_pb2.Example.FromString(data)
    assert parsed.features.feature["image"].bytes_list.value == [b"png"]
    assert parsed.features.feature["label"].int64_list.value == [300]
    assert parse_example(data) == {"image": [b"png"], "label": [300]}
    assert field(2, 5, struct.pack("<f", 1.5)) == b"\x15" + struct.pack("<f", 1.5)
