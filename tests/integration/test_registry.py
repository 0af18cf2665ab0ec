"""The model registry on both stores: publish, verify, promote, rollback, failures."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from support.cutproxy import CutProxy

from training.errors import ConflictError, IntegrityError, RegistryError, StorageError
from training.registry.s3 import S3Store
from training.registry.versions import ModelRegistry

T0 = "2025-01-01T00:00:00+00:00"
T1 = "2025-01-02T00:00:00+00:00"
T2 = "2025-01-03T00:00:00+00:00"


def make_output(root: Path, seed: str, *, extra: int = 0) -> Path:
    """A training output directory shaped like the pipeline's."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.keras").write_bytes(f"keras-archive-{seed}".encode() * 50)
    sm = root / "saved_model"
    (sm / "variables").mkdir(parents=True, exist_ok=True)
    (sm / "saved_model.pb").write_bytes(f"pb-{seed}".encode() * 20)
    (sm / "variables" / "variables.index").write_bytes(b"index-" + seed.encode())
    (sm / "variables" / "variables.data-00000-of-00001").write_bytes(b"\x01" * 300)
    (root / "config.json").write_text(json.dumps({"seed": seed}))
    (root / "evaluation.json").write_text(json.dumps({"accuracy": 0.9}))
    (root / "history.json").write_text(json.dumps({"loss": [1.0, 0.5]}))
    for i in range(extra):
        (root / f"extra-{i}.bin").write_bytes(bytes([i]) * 100)
    return root


@pytest.fixture
def registry(store) -> ModelRegistry:
    return ModelRegistry(store, check_model=False)  # the pointer on fake files


def test_publish_verify_promote_rollback_round_trip(registry, store, tmp_path):
    out1 = make_output(tmp_path / "run1", "one")
    m1 = registry.publish("mnist", "v1", out1, run_id="run1", created=T0, metrics={"accuracy": 0.9})
    assert m1["version"] == "v1" and m1["run_id"] == "run1" and m1["created"] == T0
    paths = [f["path"] for f in m1["files"]]
    assert "saved_model/variables/variables.index" in paths and "model.keras" in paths
    assert store.exists("models/mnist/versions/v1/manifest.json")
    assert store.exists("models/mnist/versions/v1/saved_model/saved_model.pb")
    assert registry.verify("mnist", "v1") == m1

    # Re-publishing identical bytes is a no-op that returns the existing manifest.
    again = registry.publish(
        "mnist", "v1", out1, run_id="run1", created=T0, metrics={"accuracy": 0.9}
    )
    assert again == m1

    # Different bytes under an existing version are refused.
    other = make_output(tmp_path / "other", "different")
    with pytest.raises(RegistryError, match="already published with different contents"):
        registry.publish("mnist", "v1", other, run_id="runX", created=T1)
    assert registry.verify("mnist", "v1") == m1

    assert registry.production("mnist") is None
    registry.promote(
        "mnist", "v1", run_id="run1", at=T0, reason="first model", expected_current=None
    )
    assert registry.production("mnist") == "v1"

    registry.publish("mnist", "v2", other, run_id="run2", created=T1, metrics={"accuracy": 0.95})
    registry.promote("mnist", "v2", run_id="run2", at=T1, reason="better", expected_current="v1")
    assert registry.production("mnist") == "v2"
    # Promoting what is already in production is a no-op (a retried task).
    registry.promote("mnist", "v2", run_id="run2", at=T1, reason="better")
    assert len(registry.history("mnist")) == 2

    registry.rollback("mnist", "v1", run_id="ops-1", at=T2, note="v2 misbehaves", by="ana")
    assert registry.production("mnist") == "v1"
    history = registry.history("mnist")
    assert [(h["from"], h["to"], h["reason"], h["action"], h.get("by")) for h in history] == [
        (None, "v1", "first model", "promoted", None),
        ("v1", "v2", "better", "promoted", None),
        ("v2", "v1", "rollback: v2 misbehaves", "rollback", "ana"),
    ]
    assert all(set(h) - {"by"} == {"from", "to", "run_id", "at", "reason", "forced", "action"}
               for h in history)

    assert registry.list_models() == ["mnist"]
    versions = registry.list_versions("mnist")
    assert [v["version"] for v in versions] == ["v2", "v1"]
    assert versions[0]["metrics"] == {"accuracy": 0.95}
    assert registry.show("mnist", "v2")["run_id"] == "run2"
    with pytest.raises(RegistryError, match="no complete version 'v9'"):
        registry.show("mnist", "v9")

    # A stale decision (made against v2, production is v1) is refused.
    with pytest.raises(ConflictError, match="decide again"):
        registry.promote("mnist", "v2", run_id="r", at=T2, reason="x", expected_current="v2")


def test_download_copies_every_published_file_byte_for_byte(registry, tmp_path):
    out = make_output(tmp_path / "run", "one")
    registry.publish("m", "v1", out, run_id="r", created=T0)
    dest = Path(registry.download("m", "v1", tmp_path / "dl"))
    assert dest == tmp_path / "dl"
    published = {f.relative_to(out) for f in out.rglob("*") if f.is_file()}
    assert {f.relative_to(dest) for f in dest.rglob("*") if f.is_file()} == published
    for rel in published:
        assert (dest / rel).read_bytes() == (out / rel).read_bytes()


def test_a_flipped_byte_fails_verification_and_blocks_promotion(registry, store, tmp_path, corrupt):
    registry.publish("m", "v1", make_output(tmp_path / "a", "a"), run_id="r1", created=T0)
    registry.promote("m", "v1", run_id="r1", at=T0, reason="first")
    registry.publish("m", "v2", make_output(tmp_path / "b", "b"), run_id="r2", created=T1)
    corrupt(store, "models/m/versions/v2/saved_model/variables/variables.data-00000-of-00001")
    with pytest.raises(IntegrityError, match="variables.data-00000-of-00001"):
        registry.verify("m", "v2")
    with pytest.raises(IntegrityError, match="refusing to promote .*variables.data"):
        registry.promote("m", "v2", run_id="r2", at=T1, reason="better")
    assert registry.production("m") == "v1"
    with pytest.raises(IntegrityError, match="variables.data-00000-of-00001"):
        registry.download("m", "v2", tmp_path / "dl")


def test_a_flipped_byte_without_stored_checksum_is_caught_by_the_manifest(
    s3_store, tmp_path, corrupt
):
    registry = ModelRegistry(s3_store, check_model=False)
    registry.publish("m", "v1", make_output(tmp_path / "a", "a"), run_id="r1", created=T0)
    corrupt(s3_store, "models/m/versions/v1/model.keras", keep_metadata=False)
    with pytest.raises(IntegrityError, match="'model.keras'.*manifest says"):
        registry.verify("m", "v1")


@pytest.mark.parametrize("initial", [None, "v1"])
def test_two_racing_promotions_have_exactly_one_winner(registry, tmp_path, initial):
    for i, v in enumerate(["v1", "v2", "v3"]):
        registry.publish("m", v, make_output(tmp_path / v, v), run_id=f"r{i}", created=T0)
    if initial:
        registry.promote("m", initial, run_id="r0", at=T0, reason="first")
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    # Both read production before either writes, so both reach the conditional write.
    real_read = registry._read_pointer

    def read_then_wait(name):
        pointer = real_read(name)
        barrier.wait(timeout=30)
        return pointer

    registry._read_pointer = read_then_wait

    def promote(version):
        try:
            registry.promote("m", version, run_id=f"race-{version}", at=T1, reason="race")
            results[version] = "won"
        except ConflictError as exc:
            results[version] = exc

    threads = [threading.Thread(target=promote, args=(v,)) for v in ("v2", "v3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    registry._read_pointer = real_read

    winners = [v for v, r in results.items() if r == "won"]
    losers = [r for r in results.values() if r != "won"]
    assert len(winners) == 1, results
    assert len(losers) == 1 and "lost a race" in str(losers[0])
    assert registry.production("m") == winners[0]
    history = registry.history("m")
    assert history[-1]["to"] == winners[0] and history[-1]["from"] == initial
    assert len(history) == (2 if initial else 1)


BAD_NAMES = ["../x", "a/b", "", "..", "a..b", ".hidden", "-dash", "x" * 129, "sp ace", None,
             "model\n", "v1\n"]  # a trailing newline passes re.match with $: fullmatch


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_names_and_versions_are_refused_before_any_write(registry, store, tmp_path, bad):
    out = make_output(tmp_path / "out", "x")
    rule = "must be 1 to 128 letters, digits, '.', '_' or '-'"
    with pytest.raises(RegistryError, match=rf"model name {rule}.* got") as err:
        registry.publish(bad, "v1", out, run_id="r", created=T0)
    assert repr(bad)[:200] in str(err.value)
    assert len(str(err.value)) < 400  # an input of any length is cut in the message
    with pytest.raises(RegistryError, match=rf"version {rule}.* got"):
        registry.publish("ok", bad, out, run_id="r", created=T0)
    with pytest.raises(RegistryError, match=rule):
        registry.promote(bad, "v1", run_id="r", at=T0, reason="x")
    with pytest.raises(RegistryError, match=rule):
        registry.promote("ok", bad, run_id="r", at=T0, reason="x")
    assert store.list("") == []


def test_publish_inputs_are_validated(registry, store, tmp_path):
    out = make_output(tmp_path / "out", "x")
    with pytest.raises(RegistryError, match="created must be an ISO 8601 time .* got 'yesterday'"):
        registry.publish("m", "v1", out, run_id="r", created="yesterday")
    with pytest.raises(RegistryError, match="local_dir must be an existing directory"):
        registry.publish("m", "v1", tmp_path / "missing", run_id="r", created=T0)
    with pytest.raises(RegistryError, match="metrics must be JSON-serializable"):
        registry.publish("m", "v1", out, run_id="r", created=T0, metrics={"a": object()})
    (out / "manifest.json").write_text("{}")
    with pytest.raises(RegistryError, match="must not hold a top-level manifest.json"):
        registry.publish("m", "v1", out, run_id="r", created=T0)
    with pytest.raises(RegistryError, match="no complete version 'v1'"):
        registry.promote("m", "v1", run_id="r", at=T0, reason="x")
    with pytest.raises(RegistryError, match="nothing in production to roll back"):
        registry.rollback("m", "v1", run_id="r", at=T0)
    assert store.list("") == []


class _FailAfter:
    """Delegates to a store; runs ``action`` once ``n`` files are uploaded, just before
    the next upload starts (so that upload is the call that meets the broken link)."""

    def __init__(self, inner, n, action):
        self._inner, self._n, self._action = inner, n, action
        self.uploaded = 0

    def put_file(self, key, local_path):
        if self.uploaded == self._n:
            self._action()
        self._inner.put_file(key, local_path)
        self.uploaded += 1

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.fixture
def proxy(s3_server):
    """A link to the session's S3 server that the test cuts and restores."""
    link = CutProxy("127.0.0.1", s3_server.port)
    try:
        yield link
    finally:
        link.close()


def test_publish_survives_a_cut_link_to_s3(s3_server, proxy, bucket, tmp_path):
    """The link to the server is cut after 3 of 10 files (every connection dropped, new
    ones reset at once, no timeout involved): the publish fails with StorageError,
    production and v1 are untouched, no v2 exists; once the link is back (the server
    kept its state all along) a retry completes v2, leaving exactly one complete v2."""
    store = S3Store(bucket, "reg", s3_server.options(endpoint_url=proxy.endpoint,
                                                     max_attempts=2))
    registry = ModelRegistry(store, check_model=False)
    out1 = make_output(tmp_path / "run1", "one")
    registry.publish("m", "v1", out1, run_id="r1", created=T0, metrics={"accuracy": 0.9})
    registry.promote("m", "v1", run_id="r1", at=T0, reason="first")

    out2 = make_output(tmp_path / "run2", "two", extra=3)
    flaky = ModelRegistry(_FailAfter(store, 3, proxy.cut), check_model=False)
    try:
        with pytest.raises(StorageError, match="cannot upload .*extra-1.bin"):
            flaky.publish("m", "v2", out2, run_id="r2", created=T1, metrics={"accuracy": 0.95})
        assert flaky.store.uploaded == 3
    finally:
        proxy.restore()

    assert registry.production("m") == "v1"
    assert [v["version"] for v in registry.list_versions("m")] == ["v1"]
    with pytest.raises(RegistryError, match="no complete version 'v2'"):
        registry.show("m", "v2")
    registry.verify("m", "v1")

    manifest = registry.publish(
        "m", "v2", out2, run_id="r2", created=T1, metrics={"accuracy": 0.95}
    )
    assert [v["version"] for v in registry.list_versions("m")] == ["v2", "v1"]
    assert registry.verify("m", "v2") == manifest
    assert store.list("models/m/versions/v2/").count("models/m/versions/v2/manifest.json") == 1
    registry.promote("m", "v2", run_id="r2", at=T1, reason="better", expected_current="v1")
    assert registry.production("m") == "v2"


def test_publish_after_the_s3_server_is_killed_and_restarted(fresh_s3_server, tmp_path):
    """The server is killed after 2 of 10 uploads: the publish fails with StorageError
    (the connection is refused at once, no timeout involved). Restarted on the same
    port and data (SeaweedFS keeps its objects on disk), the server still has what was
    there before the crash: production v1, v1 complete, no v2; the same store object
    recovers and the retried publish completes v2, production untouched."""
    server = fresh_s3_server
    bucket = server.create_bucket()
    store = S3Store(bucket, "", server.options(max_attempts=2))
    registry = ModelRegistry(store, check_model=False)
    out1 = make_output(tmp_path / "run1", "one")
    out2 = make_output(tmp_path / "run2", "two", extra=3)
    registry.publish("m", "v1", out1, run_id="r1", created=T0)
    registry.promote("m", "v1", run_id="r1", at=T0, reason="first")

    flaky = ModelRegistry(_FailAfter(store, 2, server.kill), check_model=False)
    with pytest.raises(StorageError, match="cannot upload .*EndpointConnectionError"):
        flaky.publish("m", "v2", out2, run_id="r2", created=T1)

    server.start()  # same port, same data
    assert registry.production("m") == "v1"
    assert [v["version"] for v in registry.list_versions("m")] == ["v1"]
    with pytest.raises(RegistryError, match="no complete version 'v2'"):
        registry.show("m", "v2")
    registry.verify("m", "v1")
    registry.publish("m", "v2", out2, run_id="r2", created=T1)
    assert [v["version"] for v in registry.list_versions("m")] == ["v2", "v1"]
    registry.verify("m", "v2")
    assert registry.production("m") == "v1"
    assert [h["to"] for h in registry.history("m")] == ["v1"]


@pytest.mark.slow
def test_safe_loading_refuses_a_lambda_layer_and_loads_a_plain_model(registry, tmp_path):
    import keras
    import numpy as np

    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    unsafe = keras.Sequential(
        [keras.Input((3,)), keras.layers.Lambda(lambda x: x * 2.0), keras.layers.Dense(2)]
    )
    for name, model in [("plain", plain), ("unsafe", unsafe)]:
        out = tmp_path / name
        out.mkdir()
        model.save(out / "model.keras")
        registry.publish(name, "v1", out, run_id=name, created=T0)

    loaded = registry.load_model("plain", "v1", tmp_path / "dl-plain")
    x = np.ones((1, 3), dtype="float32")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), plain.predict(x, verbose=0))

    with pytest.raises(RegistryError, match="refused by Keras safe_mode.*Lambda"):
        registry.load_model("unsafe", "v1", tmp_path / "dl-unsafe")


def test_a_rejection_or_a_timeout_is_recorded_and_moves_nothing(registry, tmp_path):
    registry.publish("mnist", "v1", make_output(tmp_path / "run1", "one"), run_id="run1",
                     created=T0)
    # Before anything was promoted: the pointer records the decision, production None.
    registry.record_decision("mnist", "v1", action="rejected", run_id="run1", at=T0,
                             reason="the confusion matrix looks wrong", by="ana")
    assert registry.production("mnist") is None
    registry.record_decision("mnist", "v1", action="rejected", run_id="run1", at=T0,
                             reason="the confusion matrix looks wrong", by="ana")  # a retry
    assert len(registry.history("mnist")) == 1
    registry.promote("mnist", "v1", run_id="run2", at=T1, reason="approved", by="bo")
    registry.publish("mnist", "v2", make_output(tmp_path / "run2", "two"), run_id="run2",
                     created=T1)
    registry.record_decision("mnist", "v2", action="timed out", run_id="run2", at=T2,
                             reason="no answer within 60 minutes")
    assert registry.production("mnist") == "v1"
    assert [(h["action"], h["from"], h["to"], h.get("rejected"), h.get("by"))
            for h in registry.history("mnist")] == [
        ("rejected", None, None, "v1", "ana"), ("promoted", None, "v1", None, "bo"),
        ("timed out", "v1", "v1", "v2", None)]
    with pytest.raises(RegistryError, match="reason must be a non-empty string"):
        registry.record_decision("mnist", "v2", action="rejected", run_id="r", at=T2,
                                 reason=" ")
    with pytest.raises(RegistryError, match="action must be 'rejected' or 'timed out'"):
        registry.record_decision("mnist", "v2", action="vetoed", run_id="r", at=T2,
                                 reason="x")
