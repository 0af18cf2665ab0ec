"""The serving layout's rules on a real local store (training/registry/serving.py): every
move of the pointer is a new integer folder, the highest is production, a retry takes
the same number, a folder's ``saved_model.pb`` is written last and removed first, the
last ``keep`` folders stay, and a follower of the pointer that fails never undoes it.

The versions here hold a SavedModel's files as bytes (the registry's pointer runs with
``check_model=False``); tests/integration/test_tracking.py loads real ones with
``tf.saved_model.load`` from this layout.
"""

from __future__ import annotations

import json

import pytest

from training.errors import RegistryError
from training.registry.local import FileStore
from training.registry.serving import ServingLayout, move_number
from training.registry.versions import ModelRegistry

AT = "2026-12-01T00:00:00+00:00"
FILES = {"saved_model.pb": b"graph-{v}", "fingerprint.pb": b"fp-{v}",
         "variables/variables.index": b"index-{v}",
         "variables/variables.data-00000-of-00001": b"data-{v}"}


class Recording(FileStore):
    """A local store that remembers the order of its writes and deletes."""

    def __init__(self, root):
        super().__init__(root)
        self.events: list[tuple[str, str]] = []

    def put_file(self, key, local_path):
        self.events.append(("put", key))
        super().put_file(key, local_path)

    def delete(self, key):
        self.events.append(("delete", key))
        super().delete(key)


def _publish(registry: ModelRegistry, tmp_path, version: str, *, saved_model=True) -> None:
    model = tmp_path / f"model-{version}"
    (model / "saved_model" / "variables").mkdir(parents=True)
    (model / "model.keras").write_bytes(b"keras-" + version.encode())
    if saved_model:
        for rel, body in FILES.items():
            (model / "saved_model" / rel).write_bytes(body.replace(b"{v}", version.encode()))
    registry.publish("m", version, model, run_id=version, created=AT)


@pytest.fixture
def registry(tmp_path):
    return ModelRegistry(Recording(tmp_path / "store"), check_model=False, serving_keep=2)


def test_each_move_is_a_new_highest_folder_holding_production(registry, tmp_path):
    layout = ServingLayout(registry.store)
    for version in ("v1", "v2"):
        _publish(registry, tmp_path, version)
        registry.promote("m", version, run_id=version, at=AT, reason="won")
    assert layout.numbers("m") == [1, 2] and layout.served("m") == 2
    registry.rollback("m", "v1", run_id="back", at=AT, note="v2 is worse")
    # A rollback pushes the older model as a new number: the highest is production.
    assert layout.served("m") == 3
    assert registry.store.get_bytes("serving/m/3/saved_model.pb") == b"graph-v1"
    assert registry.store.get_bytes("serving/m/3/variables/variables.index") == b"index-v1"
    assert [p["version"] for p in layout.index("m")] == ["v1", "v2", "v1"]
    # keep=2: folder 1 is gone, whole.
    assert layout.numbers("m") == [2, 3]
    assert registry.store.list("serving/m/1/") == []


def test_saved_model_pb_is_written_last_and_removed_first(registry, tmp_path):
    for version in ("v1", "v2", "v3"):
        _publish(registry, tmp_path, version)
        registry.store.events.clear()
        registry.promote("m", version, run_id=version, at=AT, reason="won")
        puts = [key for event, key in registry.store.events
                if event == "put" and key.startswith(f"serving/m/{version[1]}/")]
        assert len(puts) == len(FILES) and puts[-1].endswith("/saved_model.pb"), puts
    deletes = [key for event, key in registry.store.events if event == "delete"]
    assert deletes[0] == "serving/m/1/saved_model.pb" and len(deletes) == len(FILES)


def test_a_retried_promotion_pushes_nothing_twice_and_finishes_a_partial_push(
        registry, tmp_path):
    _publish(registry, tmp_path, "v1")
    registry.promote("m", "v1", run_id="v1", at=AT, reason="won")
    registry.store.events.clear()
    registry.promote("m", "v1", run_id="v1", at=AT, reason="won")  # a retried task
    assert registry.store.events == []
    # A push that stopped before its marker: the folder is not servable, and the
    # same promotion again completes it under the same number.
    registry.store.delete("serving/m/1/saved_model.pb")
    assert ServingLayout(registry.store).numbers("m") == []
    registry.promote("m", "v1", run_id="v1", at=AT, reason="won")
    assert ServingLayout(registry.store).numbers("m") == [1]


def test_a_version_without_a_saved_model_leaves_serving_as_it_was(registry, tmp_path,
                                                                  caplog):
    _publish(registry, tmp_path, "plain", saved_model=False)
    registry.promote("m", "plain", run_id="plain", at=AT, reason="won")
    assert registry.production("m") == "plain"
    assert ServingLayout(registry.store).numbers("m") == []
    assert "has no SavedModel" in caplog.text


def test_rejections_do_not_count_as_moves():
    pointer = {"version": "v2", "history": [
        {"from": None, "to": "v1"}, {"from": "v1", "to": "v1", "rejected": "x"},
        {"from": "v1", "to": "v2"}]}
    assert move_number(pointer) == 2


def test_a_follower_that_fails_never_fails_the_promotion(tmp_path, caplog):
    class Broken:
        def pointer_moved(self, name, pointer, store_uri):
            raise RuntimeError("a follower's own failure")

    registry = ModelRegistry(FileStore(tmp_path / "store"), check_model=False,
                             followers=[Broken()])
    _publish(registry, tmp_path, "v1")
    registry.promote("m", "v1", run_id="v1", at=AT, reason="won")
    assert registry.production("m") == "v1"  # production.json stays the truth
    assert "did not follow model m to v1: a follower's own failure" in caplog.text


@pytest.mark.parametrize("keep", [0, -1, 1.5, True, "3"])
def test_keep_must_be_a_whole_number_from_one(tmp_path, keep):
    with pytest.raises(RegistryError, match=f"got {keep!r}"):
        ServingLayout(FileStore(tmp_path), keep)


def test_the_index_says_which_version_each_number_holds(registry, tmp_path):
    _publish(registry, tmp_path, "v1")
    registry.promote("m", "v1", run_id="v1", at=AT, reason="won")
    index = json.loads(registry.store.get_bytes("serving/m/serving.json"))
    assert index == {"name": "m", "pushed": [{"number": 1, "version": "v1"}]}
    assert ServingLayout(registry.store).base_uri("m").endswith("/store/serving/m")
