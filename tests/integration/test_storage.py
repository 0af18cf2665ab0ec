"""Both stores through the same tests: a local directory and S3 over HTTP (SeaweedFS)."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import threading

import pytest

from training.errors import ConflictError, IntegrityError, StorageError
from training.registry import open_store
from training.registry.local import FileStore
from training.registry.s3 import S3Options, S3Store


def test_bytes_round_trip_and_etag_follows_content(store):
    etag1 = store.put_bytes("a/b/one.txt", b"hello")
    data, etag = store.get_with_etag("a/b/one.txt")
    assert (data, etag) == (b"hello", etag1)
    assert store.get_bytes("a/b/one.txt") == b"hello"
    etag2 = store.put_bytes("a/b/one.txt", b"hello again")
    assert etag2 != etag1
    assert store.get_with_etag("a/b/one.txt") == (b"hello again", etag2)
    info = store.head("a/b/one.txt")
    assert info.size == len(b"hello again")
    assert info.sha256 == hashlib.sha256(b"hello again").hexdigest()
    assert store.exists("a/b/one.txt") and store.size("a/b/one.txt") == 11


def test_missing_objects(store):
    assert store.get_with_etag("nope") is None
    assert store.head("nope") is None
    assert not store.exists("nope")
    with pytest.raises(StorageError, match="no object at .*'nope'"):
        store.get_bytes("nope")
    with pytest.raises(StorageError, match="no object"):
        store.size("nope")


def test_create_only_write_refuses_an_existing_object(store):
    store.put_bytes("pointer.json", b"first", if_none_match=True)
    with pytest.raises(ConflictError, match="pointer.json"):
        store.put_bytes("pointer.json", b"second", if_none_match=True)
    assert store.get_bytes("pointer.json") == b"first"


def test_if_match_replaces_only_what_was_read(store):
    etag = store.put_bytes("p", b"v1")
    new_etag = store.put_bytes("p", b"v2", if_match=etag)
    with pytest.raises(ConflictError, match="'p'"):
        store.put_bytes("p", b"v3", if_match=etag)  # stale ETag
    assert store.get_with_etag("p") == (b"v2", new_etag)
    with pytest.raises(ConflictError):
        store.put_bytes("missing", b"x", if_match=etag)
    assert not store.exists("missing")


def test_list_is_a_sorted_string_prefix_match(store):
    for key in ["m/b/2", "m/a/1", "m/ab", "n/1", "m/a/sub/3"]:
        store.put_bytes(key, key.encode())
    assert store.list("m/a") == ["m/a/1", "m/a/sub/3", "m/ab"]
    assert store.list("m/a/") == ["m/a/1", "m/a/sub/3"]
    assert store.list("") == ["m/a/1", "m/a/sub/3", "m/ab", "m/b/2", "n/1"]
    assert store.list("zzz/") == []


def test_files_round_trip(store, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 100)
    store.put_file("dir/file.bin", src)
    dest = tmp_path / "out" / "copy.bin"
    dest.parent.mkdir()
    store.get_file("dir/file.bin", dest)
    assert dest.read_bytes() == src.read_bytes()
    assert store.head("dir/file.bin").sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    with pytest.raises(StorageError, match="no object"):
        store.get_file("dir/missing.bin", tmp_path / "x")


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/./b", "a/../b", "", "a/.~tmp-1"])
def test_unsafe_keys_are_refused(store, key):
    with pytest.raises(StorageError, match="object key"):
        store.put_bytes(key, b"x")
    assert store.list("") == []


@pytest.mark.parametrize("mode", ["create", "replace"])
def test_concurrent_conditional_writes_have_one_winner(store, mode):
    """On the session's SeaweedFS as it is: it decides a conditional write atomically
    (seaweedfs/seaweedfs#8801), so the writers race for real, none held back."""
    threads_n, rounds = 6, 5
    for r in range(rounds):
        key = f"race/{mode}/{r}"
        etag = None if mode == "create" else store.put_bytes(key, b"base")
        barrier = threading.Barrier(threads_n)
        wins, losses, errors = [], [], []

        def writer(i, key=key, etag=etag, barrier=barrier, wins=wins, losses=losses, errors=errors):
            barrier.wait()
            try:
                if etag is None:
                    store.put_bytes(key, f"w{i}".encode(), if_none_match=True)
                else:
                    store.put_bytes(key, f"w{i}".encode(), if_match=etag)
                wins.append(i)
            except ConflictError:
                losses.append(i)
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(wins) == 1, f"round {r}: winners {wins}"
        assert len(losses) == threads_n - 1
        assert store.get_bytes(key) == f"w{wins[0]}".encode()


# ------------------------------------------------------------------ S3 specifics


def test_s3_multipart_upload_round_trip(s3_server, bucket, tmp_path):
    store = S3Store(
        bucket, "", s3_server.options(multipart_threshold_mb=5, multipart_chunksize_mb=5)
    )
    src = tmp_path / "big.bin"
    src.write_bytes(hashlib.sha256(b"seed").digest() * (6 * 1024 * 1024 // 32 + 7))
    store.put_file("big.bin", src)
    etag = store.head("big.bin").etag
    assert etag.strip('"').endswith("-2"), f"expected a 2-part multipart ETag, got {etag}"
    out = tmp_path / "big.out"
    store.get_file("big.bin", out)
    assert out.read_bytes() == src.read_bytes()


def test_s3_download_is_checked_against_the_recorded_sha256(s3_store, tmp_path, corrupt):
    s3_store.put_bytes("model/weights.bin", b"\x00" * 1000)
    corrupt(s3_store, "model/weights.bin")
    with pytest.raises(IntegrityError, match="'model/weights.bin'.*corrupt"):
        s3_store.get_bytes("model/weights.bin")
    with pytest.raises(IntegrityError, match="'model/weights.bin'"):
        s3_store.get_file("model/weights.bin", tmp_path / "w.bin")
    assert not (tmp_path / "w.bin").exists()


def test_s3_every_call_carries_checksum_encryption_and_owner(s3_server, bucket, tmp_path):
    store = S3Store(
        bucket, "p", s3_server.options(sse="AES256", expected_bucket_owner="123456789012")
    )
    seen = []

    def capture(params, model, **_):
        seen.append((model.name, dict(params)))

    store._client.meta.events.register("provide-client-params.s3.*", capture)
    store.put_bytes("x", b"data")
    (tmp_path / "f").write_bytes(b"file")
    store.put_file("f", tmp_path / "f")
    store.get_bytes("x")
    store.get_file("f", tmp_path / "g")
    store.head("x")
    store.list("")
    names = {name for name, _ in seen}
    assert {"PutObject", "GetObject", "HeadObject", "ListObjectsV2"} <= names
    for name, params in seen:
        assert params.get("ExpectedBucketOwner") == "123456789012", name
        if name == "PutObject":
            assert params["ServerSideEncryption"] == "AES256"
            assert params["ChecksumAlgorithm"] == "SHA256"
            assert len(params["Metadata"]["sha256"]) == 64
    head = s3_server.client().head_object(Bucket=bucket, Key="p/x")
    assert head["ServerSideEncryption"] == "AES256"


def test_s3_refused_credentials_and_a_foreign_bucket_are_storage_errors(s3_server, bucket):
    """The server checks every signature and limits the team to its buckets: a refusal
    is a StorageError naming the code, never "no such object", never the secret."""
    wrong = S3Store(bucket, "p", s3_server.options(aws_secret_access_key="not-the-secret",
                                                   max_attempts=1))
    with pytest.raises(StorageError, match="cannot write 'k' .*SignatureDoesNotMatch") as err:
        wrong.put_bytes("k", b"x")
    assert "not-the-secret" not in str(err.value)
    with pytest.raises(StorageError, match="cannot read 'k' .*SignatureDoesNotMatch"):
        wrong.get_with_etag("k")

    foreign = f"other-{bucket}"  # not one of the team's test-* buckets
    s3_server.client().create_bucket(Bucket=foreign)
    s3_server.client().put_object(Bucket=foreign, Key="p/k", Body=b"admin's")
    elsewhere = S3Store(foreign, "p", s3_server.options(max_attempts=1))
    with pytest.raises(StorageError, match="cannot write 'k' .*AccessDenied"):
        elsewhere.put_bytes("k", b"x")
    with pytest.raises(StorageError, match="cannot read 'k' .*AccessDenied"):
        elsewhere.get_with_etag("k")
    with pytest.raises(StorageError, match="cannot stat 'k'"):
        elsewhere.head("k")
    with pytest.raises(StorageError, match="cannot list '' .*AccessDenied"):
        elsewhere.list("")
    assert s3_server.client().get_object(Bucket=foreign, Key="p/k")["Body"].read() == b"admin's"


def test_s3_unreachable_endpoint_is_a_storage_error():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = S3Options(
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        max_attempts=1,
        connect_timeout_s=1,
    )
    store = S3Store("bucket", "", options)
    with pytest.raises(StorageError, match="cannot write 'k'"):
        store.put_bytes("k", b"x")


# ------------------------------------------------------------------ options and URIs


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retry_mode": "legacy"}, "retry_mode must be one of standard, adaptive, got 'legacy'"),
        ({"max_attempts": 0}, "max_attempts must be an integer between 1 and 20, got 0"),
        ({"multipart_chunksize_mb": 1}, "multipart_chunksize_mb must be .* got 1"),
        ({"sse": "aes"}, "sse must be None, 'AES256' or 'aws:kms', got 'aes'"),
        ({"sse_kms_key_id": "k"}, "sse_kms_key_id is only allowed with sse='aws:kms'"),
        ({"expected_bucket_owner": "me"}, "expected_bucket_owner must be a 12-digit"),
        ({"endpoint_url": "localhost:9000"}, "endpoint_url must be an http"),
        ({"aws_access_key_id": "AKIA"}, "must be given together"),
        ({"read_timeout_s": 0}, "read_timeout_s must be"),
    ],
)
def test_s3_options_validation_names_field_and_value(kwargs, message):
    with pytest.raises(StorageError, match=message):
        S3Options(**kwargs)


def test_s3_options_repr_masks_credentials():
    options = S3Options(
        aws_access_key_id="AKIAREALKEYID",
        aws_secret_access_key="wJalrXUtnFEMIsecret",
        aws_session_token="sessiontokenvalue",
    )
    for text in (repr(options), str(options), f"{options}"):
        assert "AKIAREALKEYID" not in text
        assert "wJalrXUtnFEMIsecret" not in text
        assert "sessiontokenvalue" not in text
        assert "aws_secret_access_key='***'" in text


def test_open_store_picks_the_store_from_the_uri(tmp_path, s3_server):
    assert isinstance(open_store(str(tmp_path)), FileStore)
    local = open_store(tmp_path.as_uri())
    assert isinstance(local, FileStore) and local.root == tmp_path
    s3 = open_store("s3://my-bucket/some/prefix/", s3_server.options())
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix, s3.uri) == (
        "my-bucket",
        "some/prefix",
        "s3://my-bucket/some/prefix",
    )
    assert "secret" not in repr(s3)
    with pytest.raises(StorageError, match="scheme must be s3:// or file://"):
        open_store("gs://bucket/x")
    with pytest.raises(StorageError, match="local absolute path"):
        open_store("file://otherhost/x")
    with pytest.raises(StorageError, match="S3Options apply to s3:// stores only"):
        open_store(str(tmp_path), S3Options())


def test_importing_storage_does_not_import_boto3():
    code = ("import sys, training.registry, training.registry.s3; "
            "print('boto3' in sys.modules, 'botocore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
