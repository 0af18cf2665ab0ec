"""The two drift distances ``validation.py``'s drift check compares with its threshold.

Both are in [0, 1] (see ``validation.py``'s doc for the definitions): the label
distance (Jensen-Shannon, base 2, of the class proportions aligned by label name) and
the pixel shift (the largest per-channel move of the pixel mean, in production's
standard deviations, divided by 2).
"""

from __future__ import annotations

import math

MIN_STD = 1.0  # grey levels: the pixel-shift denominator's floor


def js_distance(p: list[float], q: list[float]) -> float:
    """Jensen-Shannon distance, base 2, between two distributions (normalised here)."""
    sp, sq = sum(p), sum(q)
    p, q = [x / sp for x in p], [x / sq for x in q]

    def kl(a: list[float], m: list[float]) -> float:
        return sum(x * math.log2(x / y) for x, y in zip(a, m, strict=True) if x > 0)

    m = [(x + y) / 2 for x, y in zip(p, q, strict=True)]
    return math.sqrt(min(max(kl(p, m) / 2 + kl(q, m) / 2, 0.0), 1.0))


def pixel_shift(mean: list[float], ref_mean: list[float], ref_std: list[float]) -> float:
    """``min(1, max_c |mean_c - ref_mean_c| / max(ref_std_c, MIN_STD) / 2)``."""
    shifts = [abs(a - b) / max(s, MIN_STD) for a, b, s in zip(mean, ref_mean, ref_std,
                                                             strict=True)]
    return min(1.0, max(shifts) / 2)


def over(what: str, value: float, threshold: float, unit: str) -> str:
    text, limit = f"{value:.2f}", f"{threshold:.2f}"
    if text == limit:
        text, limit = f"{value:.4f}", f"{threshold:.4f}"
    return f"{what} moved by {text} ({unit}), more than the threshold {limit}"


def distances(mine: dict, names: list[str], reference: dict, ref: dict
              ) -> tuple[float, float | None]:
    """Label distance and pixel shift of ``mine`` (counts by ``names``' order, pixel
    mean) from production's train split ``ref`` (pixel shift None: channels differ)."""
    labels = list(dict.fromkeys([*reference["label_names"], *names]))
    counts = dict(zip(names, mine["class_counts"], strict=False))
    theirs = dict(zip(reference["label_names"], ref["class_counts"], strict=False))
    distance = js_distance([counts.get(n, 0) for n in labels],
                           [theirs.get(n, 0) for n in labels])
    if len(mine["pixel_mean"]) != len(ref["pixel_mean"]):  # the schema check fails it
        return distance, None
    return distance, pixel_shift(mine["pixel_mean"], ref["pixel_mean"], ref["pixel_std"])


def new_partitions(stats: dict, reference: dict) -> dict[str, dict]:
    """The partitions (days) of a team's data that production was not trained on."""
    known = set(reference.get("partitions") or {})
    return {p: s for p, s in (stats.get("partitions") or {}).items()
            if p not in known and s.get("num_examples")}
