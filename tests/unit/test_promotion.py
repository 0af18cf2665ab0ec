"""Champion versus challenger decisions, with their written reasons."""

from __future__ import annotations

import json

import pytest

from training.errors import ConfigError
from training.registry.policy import Decision, PromotionPolicy, decide

POLICY = PromotionPolicy(min_accuracy=0.9, min_improvement=0.0)


def test_first_model_is_promoted_when_it_reaches_the_minimum():
    d = decide({"accuracy": 0.9611, "loss": 0.12}, None, POLICY)
    assert d.promote and not d.forced
    assert d.reasons[0] == "challenger accuracy 0.9611 >= minimum 0.9000"
    assert "first model" in d.reasons[1]


def test_first_model_below_the_minimum_is_refused_with_the_numbers():
    d = decide({"accuracy": 0.85}, None, POLICY)
    assert not d.promote and not d.forced
    assert d.reasons[0] == "challenger accuracy 0.8500 < minimum 0.9000"


def test_exactly_the_minimum_passes():
    assert decide({"accuracy": 0.9}, None, POLICY).promote


def test_improvement_over_the_champion_passes():
    d = decide({"accuracy": 0.9611}, {"accuracy": 0.9488}, POLICY, champion_version="v3")
    assert d.promote
    assert d.reasons == [
        "challenger accuracy 0.9611 >= minimum 0.9000",
        "improvement +0.0123 over champion v3 (0.9488) >= required +0.0000",
    ]


def test_a_regression_is_refused_and_says_why():
    d = decide({"accuracy": 0.95}, {"accuracy": 0.96, "version": "v7"}, POLICY)
    assert not d.promote
    assert d.reasons[0] == "improvement -0.0100 over champion v7 (0.9600) < required +0.0000"
    assert "challenger accuracy 0.9500 >= minimum 0.9000" in d.reasons


def test_an_equal_model_passes_a_zero_improvement_despite_float_noise():
    # 0.3 - 0.1 - 0.2 is not exactly 0 in floating point.
    policy = PromotionPolicy(min_accuracy=0.0, min_improvement=0.0)
    assert decide({"accuracy": 0.3 - 0.1}, {"accuracy": 0.2}, policy).promote


def test_required_improvement_not_reached():
    policy = PromotionPolicy(min_accuracy=0.5, min_improvement=0.01)
    d = decide({"accuracy": 0.955}, {"accuracy": 0.95}, policy)
    assert not d.promote
    assert d.reasons[0] == "improvement +0.0050 over champion (0.9500) < required +0.0100"


def test_negative_min_improvement_allows_a_bounded_regression():
    policy = PromotionPolicy(min_accuracy=0.9, min_improvement=-0.01)
    allowed = decide({"accuracy": 0.955}, {"accuracy": 0.96}, policy)
    assert allowed.promote
    assert "improvement -0.0050 over champion (0.9600) >= required -0.0100" in allowed.reasons
    refused = decide({"accuracy": 0.945}, {"accuracy": 0.96}, policy)
    assert not refused.promote
    assert refused.reasons[0] == "improvement -0.0150 over champion (0.9600) < required -0.0100"


def test_both_failures_are_listed():
    d = decide({"accuracy": 0.8}, {"accuracy": 0.85}, POLICY)
    assert not d.promote
    assert len(d.reasons) == 2 and all("<" in r for r in d.reasons)


def test_forced_promotion_is_marked_and_keeps_the_failing_reasons():
    d = decide({"accuracy": 0.8}, {"accuracy": 0.95}, POLICY, force=True)
    assert d.promote and d.forced
    assert d.reasons[0].startswith("forced:")
    assert "challenger accuracy 0.8000 < minimum 0.9000" in d.reasons
    assert "improvement -0.1500 over champion (0.9500) < required +0.0000" in d.reasons


def test_force_on_a_passing_model_is_not_marked_forced():
    d = decide({"accuracy": 0.97}, {"accuracy": 0.95}, POLICY, force=True)
    assert d.promote and not d.forced
    assert "force was asked but not needed" in d.reasons[-1]


def test_decision_to_dict_is_json_ready():
    d = decide({"accuracy": 0.97}, None, POLICY)
    as_dict = d.to_dict()
    assert as_dict == {"promote": True, "forced": False, "reasons": d.reasons}
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert isinstance(d, Decision)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_accuracy": 1.5}, "min_accuracy must be a number between 0 and 1, got 1.5"),
        ({"min_accuracy": float("nan")}, "min_accuracy must be a number between 0 and 1, got nan"),
        ({"min_accuracy": True}, "min_accuracy must be a number between 0 and 1, got True"),
        ({"min_improvement": -2}, "min_improvement must be a number between -1 and 1"),
        ({"min_improvement": "0.1"}, "min_improvement must be .* got '0.1'"),
    ],
)
def test_policy_validation_names_field_and_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PromotionPolicy(**kwargs)


@pytest.mark.parametrize(
    ("challenger", "champion", "message"),
    [
        ({"loss": 0.1}, None, "challenger metrics must be a dict with an 'accuracy' entry"),
        ({"accuracy": 1.2}, None, "challenger accuracy must be a number between 0 and 1, got 1.2"),
        ({"accuracy": 0.9}, {"accuracy": None}, "champion accuracy must be .* got None"),
    ],
)
def test_bad_metrics_are_refused(challenger, champion, message):
    with pytest.raises(ConfigError, match=message):
        decide(challenger, champion, POLICY)
