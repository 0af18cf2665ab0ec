"""promote_model's request is checked against the store before anything moves: each
bad field refused in one line naming it, the value and what is allowed."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowFailException

from training.registry.local import FileStore
from training.registry.versions import ModelRegistry
from training_airflow.manual_promotion import checked_request

T0 = "2026-12-01T00:00:00+00:00"


@pytest.fixture
def registry(tmp_path):
    registry = ModelRegistry(FileStore(tmp_path / "store"), check_model=False)
    for version in ("v1", "v2"):
        out = tmp_path / version
        out.mkdir()
        (out / "model.keras").write_bytes(version.encode() * 100)
        (out / "evaluation.json").write_text(json.dumps({"accuracy": 0.9}))
        registry.publish("digits", version, out, run_id=version, created=T0)
    registry.promote("digits", "v1", run_id="v1", at=T0, reason="first")
    return registry


GOOD = {"model_name": "digits", "version": "v2", "action": "promote", "reason": "better"}


def test_a_good_request_names_what_moves(registry):
    assert checked_request(GOOD, registry) == ("digits", "v2", "promote", "better")


@pytest.mark.parametrize(("change", "line"), [
    ({"model_name": "digitz"}, "model_name 'digitz' is not a model in the store .*; "
                               "models there: digits"),
    ({"version": "v9"}, "version 'v9' is not a complete version of model 'digits'; its "
                        "versions, newest first: v2, v1"),
    ({"reason": "  "}, "reason must say why .* got an empty reason"),
    ({"action": "delete"}, "action must be one of promote, rollback, got 'delete'"),
])
def test_each_bad_field_is_refused_in_one_line_and_nothing_moves(registry, change, line):
    with pytest.raises(AirflowFailException, match=line) as refused:
        checked_request({**GOOD, **change}, registry)
    assert "\n" not in str(refused.value)
    assert registry.production("digits") == "v1"
