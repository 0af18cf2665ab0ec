"""Champion versus challenger: should the new model replace the one in production?

Pure Python on metric dicts (no TensorFlow), so the decision is cheap to test and to
re-run. The rule:

- the challenger's accuracy must reach ``policy.min_accuracy``;
- if a champion is in production, the challenger's accuracy minus the champion's must
  reach ``policy.min_improvement`` (a negative value is the largest regression allowed);
- the first model (no champion) only has to reach the minimum.

Every decision carries reasons in plain words with the numbers. A forced promotion
promotes anyway and is marked ``forced`` when the policy alone would have refused,
keeping the reasons it would have failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from training.errors import ConfigError

__all__ = ["Decision", "PromotionPolicy", "decide"]

# Accuracies are ratios of counts; differences below this are float noise, not signal.
_TOLERANCE = 1e-9


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class PromotionPolicy:
    """Thresholds on test accuracy. ``min_improvement`` may be negative."""

    min_accuracy: float = 0.0
    min_improvement: float = 0.0

    def __post_init__(self) -> None:
        if not _number(self.min_accuracy) or not 0.0 <= self.min_accuracy <= 1.0:
            raise ConfigError(
                f"min_accuracy must be a number between 0 and 1, got {self.min_accuracy!r}"
            )
        if not _number(self.min_improvement) or not -1.0 <= self.min_improvement <= 1.0:
            raise ConfigError(
                "min_improvement must be a number between -1 and 1 (negative: the largest "
                f"accuracy drop allowed), got {self.min_improvement!r}"
            )


@dataclass(frozen=True)
class Decision:
    """The outcome and why. ``forced``: promoted only because force was asked."""

    promote: bool
    forced: bool
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"promote": self.promote, "forced": self.forced, "reasons": list(self.reasons)}


def _accuracy(metrics: Any, who: str) -> float:
    if not isinstance(metrics, dict) or "accuracy" not in metrics:
        raise ConfigError(f"{who} metrics must be a dict with an 'accuracy' entry, got {metrics!r}")
    value = metrics["accuracy"]
    if not _number(value) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{who} accuracy must be a number between 0 and 1, got {value!r}")
    return float(value)


def decide(
    challenger: dict[str, Any],
    champion: dict[str, Any] | None,
    policy: PromotionPolicy,
    force: bool = False,
    *,
    champion_version: str | None = None,
) -> Decision:
    """Decide whether ``challenger`` replaces ``champion`` (None: nothing in production).

    ``champion_version`` (or ``champion['version']``) only names the champion in the
    reasons.
    """
    if not isinstance(policy, PromotionPolicy):
        raise ConfigError(f"policy must be a PromotionPolicy, got {policy!r}")
    acc = _accuracy(challenger, "challenger")
    failures: list[str] = []
    passes: list[str] = []

    if acc + _TOLERANCE >= policy.min_accuracy:
        passes.append(f"challenger accuracy {acc:.4f} >= minimum {policy.min_accuracy:.4f}")
    else:
        failures.append(f"challenger accuracy {acc:.4f} < minimum {policy.min_accuracy:.4f}")

    if champion is None:
        passes.append("no model in production: the first model needs only the minimum")
    else:
        champ = _accuracy(champion, "champion")
        name = champion_version or champion.get("version")
        label = f"champion {name}" if name else "champion"
        gain = acc - champ
        text = (
            f"improvement {gain:+.4f} over {label} ({champ:.4f})"
            f" %s required {policy.min_improvement:+.4f}"
        )
        if gain + _TOLERANCE >= policy.min_improvement:
            passes.append(text % ">=")
        else:
            failures.append(text % "<")

    if not failures:
        reasons = passes
        if force:
            reasons = [*passes, "force was asked but not needed: the policy promotes"]
        return Decision(promote=True, forced=False, reasons=reasons)
    if force:
        return Decision(
            promote=True,
            forced=True,
            reasons=["forced: promoted although the policy refuses", *failures, *passes],
        )
    return Decision(promote=False, forced=False, reasons=[*failures, *passes])
