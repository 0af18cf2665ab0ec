"""Validation of staged data before training: rules, checks, a verdict with reasons.

``validate(stats, rules=..., reference=..., rejected=...)`` checks the statistics
``dataset_statistics`` (``statistics.py``) computed for the staged data, against
``ValidationRules`` and, when given, production's statistics (``reference``, same
format), and returns a JSON-serialisable verdict::

    {"passed": False,
     "checks": [{"name": "schema", "passed": True, "detail": "...", ...numbers}, ...],
     "reasons": ["drift: label distribution moved by 0.31 (Jensen-Shannon distance), "
                 "more than the threshold 0.20"]}

one reason (one line) per failing check. ``require_valid(verdict)`` raises
``ValidationError`` listing them. The checks, in order:

* ``schema``: the image shape equals ``rules.expected_shape`` (when set) and
  production's, the dtype is uint8, the label names are production's (same names, same
  order: a class index must mean the same class);
* ``examples_per_class``: every class has at least ``rules.min_examples_per_class``
  examples in the train split;
* ``duplicates``: no image appears in two splits (leakage);
* ``corrupt_files``: at most ``rules.max_corrupt_fraction`` of the files staging tried
  could not be decoded (``rejected``: ``{"rejected": [{"path", "reason"}], "attempted":
  N}``);
* ``drift`` (against production's train split; passes when there is none), two
  distances in [0, 1], each failing above ``rules.drift_threshold``:

  - label distance: the Jensen-Shannon distance, base 2, between the class proportions
    ``p`` (here) and ``q`` (production), aligned by label name:
    ``sqrt(KL(p||m)/2 + KL(q||m)/2)`` with ``m = (p+q)/2`` and log base 2; 0 for the
    same proportions, 1 for classes that do not overlap;
  - pixel shift: ``min(1, max_c |mean_c - ref_mean_c| / max(ref_std_c, 1) / 2)``, the
    largest per-channel shift of the pixel mean (0-255 scale) in production's standard
    deviations (at least one grey level), divided by 2: a shift of 2 standard
    deviations or more is 1. A threshold of 0.3 allows 0.6 standard deviations (the
    demo's inverted digits move by 1.03: 0.52).

  For a team's own data, the train split and each partition (day) production was not
  trained on are compared, each on its own: one drifted day among older ones moves the
  whole train split only a little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from training.data.snapshot.drift import distances, new_partitions, over
from training.data.snapshot.statistics import dataset_statistics
from training.errors import ConfigError, DatasetError, ValidationError, shown

__all__ = ["ValidationRules", "dataset_statistics", "require_valid", "validate"]

SHOWN = 10  # paths, classes or duplicates named in one reason
LISTED = 100  # rejected files a check carries (the count is always whole)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


@dataclass(frozen=True)
class ValidationRules:
    """What staged data must satisfy; checked on construction (ConfigError)."""

    min_examples_per_class: int
    max_corrupt_fraction: float
    drift_threshold: float
    expected_shape: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        value = self.min_examples_per_class
        if not _is_int(value) or value < 0:
            raise ConfigError(f"min_examples_per_class must be an integer, at least 0, "
                              f"got {shown(value)} ({type(value).__name__})")
        value = self.max_corrupt_fraction
        if not _is_number(value) or not 0 <= value <= 1:
            raise ConfigError(f"max_corrupt_fraction must be a number between 0 and 1, "
                              f"got {shown(value)} ({type(value).__name__})")
        value = self.drift_threshold
        if not _is_number(value) or value <= 0:
            raise ConfigError(f"drift_threshold must be a number greater than 0 (the largest "
                              f"allowed drift distance, at most 1 to ever fail), got "
                              f"{shown(value)} ({type(value).__name__})")
        value = self.expected_shape
        if value is not None:
            if (not isinstance(value, (tuple, list)) or len(value) != 3
                    or not all(_is_int(d) and d > 0 for d in value)):
                raise ConfigError(f"expected_shape must be None or three positive integers "
                                  f"(height, width, channels), got {shown(value)}")
            object.__setattr__(self, "expected_shape", tuple(value))
        object.__setattr__(self, "max_corrupt_fraction", float(self.max_corrupt_fraction))
        object.__setattr__(self, "drift_threshold", float(self.drift_threshold))


def _shape(shape: Any) -> str:
    return "x".join(str(d) for d in shape) if shape else "unknown"


def _more(items: list[str], total: int) -> str:
    return ", ".join(items) + (f" and {total - len(items)} more" if total > len(items) else "")


def _check(name: str, failures: list[str], passed_detail: str, **numbers: Any) -> dict:
    failed = bool(failures)
    detail = "; ".join(failures) if failed else passed_detail
    detail = detail.replace("\r", "\\r").replace("\n", "\\n")  # a reason is one line
    return {"name": name, "passed": not failed, "detail": detail, **numbers}


def _schema(stats: dict, rules: ValidationRules, reference: dict | None) -> dict:
    shape, dtype, names = stats.get("image_shape"), stats.get("image_dtype"), stats["label_names"]
    failures = []
    if rules.expected_shape is not None and list(shape or []) != list(rules.expected_shape):
        failures.append(f"images are {_shape(shape)}, expected {_shape(rules.expected_shape)} "
                        "(height x width x channels, rules.expected_shape)")
    if dtype != "uint8":
        failures.append(f"images are {dtype}, expected uint8")
    numbers: dict[str, Any] = {"image_shape": shape, "image_dtype": dtype,
                               "label_names": names}
    if reference is not None:
        ref_shape, ref_names = reference.get("image_shape"), reference["label_names"]
        numbers.update(reference_image_shape=ref_shape, reference_label_names=ref_names)
        if ref_shape and shape and list(shape) != list(ref_shape):
            failures.append(f"images are {_shape(shape)}, production's are {_shape(ref_shape)}")
        missing = [n for n in ref_names if n not in names]
        new = [n for n in names if n not in ref_names]
        numbers.update(missing_labels=missing, new_labels=new)
        if missing or new:
            parts = [f"{word} {_more([repr(n) for n in found[:SHOWN]], len(found))}"
                     for word, found in (("missing", missing), ("new", new)) if found]
            failures.append(f"labels differ from production's: {'; '.join(parts)}")
        elif names != ref_names:
            i = next(i for i, (a, b) in enumerate(zip(names, ref_names, strict=True)) if a != b)
            failures.append(f"labels are production's in another order (class {i} is "
                            f"{names[i]!r} here, {ref_names[i]!r} in production): a class "
                            "index must mean the same class")
    return _check("schema", failures, f"images {_shape(shape)} {dtype}, "
                  f"{len(names)} labels" + (" as production's" if reference else ""), **numbers)


def _train(stats: dict) -> dict:
    return stats["splits"].get("train") or {"num_examples": 0, "class_counts": [],
                                             "pixel_mean": None, "pixel_std": None}


def _examples_per_class(stats: dict, rules: ValidationRules) -> dict:
    names, counts = stats["label_names"], list(_train(stats)["class_counts"])
    counts += [0] * (len(names) - len(counts))
    low = [(n, c) for n, c in zip(names, counts, strict=True)
           if c < rules.min_examples_per_class]
    failures = []
    if low:
        shown_low = [f"{n!r} {c}" for n, c in low[:SHOWN]]
        failures.append(f"{len(low)} of {len(names)} classes have fewer than "
                        f"{rules.min_examples_per_class} train examples: "
                        f"{_more(shown_low, len(low))}")
    return _check("examples_per_class", failures,
                  f"every class has at least {rules.min_examples_per_class} train examples",
                  minimum=rules.min_examples_per_class,
                  class_counts=dict(zip(names, counts, strict=True)),
                  below_minimum={n: c for n, c in low})


def _duplicates(stats: dict) -> dict:
    found = stats["duplicates"]
    count, examples = found["count"], found["examples"]
    failures = []
    if count:
        pairs = [" = ".join(f"{s} #{i}" for s, i in pair) for pair in examples[:3]]
        many = "examples repeat" if count > 1 else "example repeats"
        failures.append(f"{count} {many} an image of another split (leakage "
                        f"between train, validation and test), e.g. {_more(pairs, count)}")
    return _check("duplicates", failures, "no image appears in two splits", count=count,
                  examples=examples, within_split=found.get("within_split", 0))


def _corrupt_files(rules: ValidationRules, rejected: dict | None) -> dict:
    if rejected is None:
        return _check("corrupt_files", [], "staging reported no rejected files", count=0,
                      attempted=None, fraction=0.0, rejected=[])
    files, attempted = rejected.get("rejected"), rejected.get("attempted")
    if (not isinstance(files, list) or not _is_int(attempted) or attempted < len(files)
            or not all(isinstance(f, dict) and "path" in f for f in files)):
        raise DatasetError(
            f"rejected must be {{'rejected': [{{'path': ..., 'reason': ...}}, ...], "
            f"'attempted': N}} with N at least the number rejected, got {shown(rejected)}")
    count = len(files)
    fraction = count / attempted if attempted else 0.0
    failures = []
    if fraction > rules.max_corrupt_fraction:
        paths = [f"{f['path']} ({f.get('reason', 'unknown')})" for f in files[:SHOWN]]
        failures.append(f"{count} of {attempted} files ({fraction:.1%}) could not be decoded, "
                        f"more than max_corrupt_fraction {rules.max_corrupt_fraction:.1%}: "
                        f"{_more(paths, count)}")
    return _check("corrupt_files", failures,
                  f"{count} of {attempted} files could not be decoded, at most "
                  f"{rules.max_corrupt_fraction:.1%} allowed", count=count,
                  attempted=attempted, fraction=fraction, rejected=files[:LISTED])


def _drift(stats: dict, rules: ValidationRules, reference: dict | None) -> dict:
    """The train split against production's, and each new day on its own against it."""
    threshold = rules.drift_threshold
    if reference is None:
        return _check("drift", [], "no production data to compare", label_distance=None,
                      pixel_shift=None, threshold=threshold)
    train, ref = _train(stats), _train(reference)
    failures = []
    label_distance = shift = None
    if not train["num_examples"] or not ref["num_examples"]:
        where = "here" if not train["num_examples"] else "in production"
        failures.append(f"cannot compare with production: the train split is empty {where}")
        compared: dict[str, dict] = {}
    else:
        compared = {"the train split": train, **new_partitions(stats, reference)}
    measured = {}
    for what, part in compared.items():
        distance, moved = distances(part, stats["label_names"], reference, ref)
        measured[what] = {"label_distance": distance, "pixel_shift": moved}
        where = "" if what == "the train split" else f"{what}: "
        if distance > threshold:
            failures.append(where + over("label distribution", distance, threshold,
                                          "Jensen-Shannon distance"))
        if moved is not None and moved > threshold:
            failures.append(where + over("pixel mean", moved, threshold,
                                          "largest channel shift in production's standard "
                                          "deviations, divided by 2"))
    if compared:
        label_distance = max(m["label_distance"] for m in measured.values())
        shifts = [m["pixel_shift"] for m in measured.values() if m["pixel_shift"] is not None]
        shift = max(shifts) if shifts else None
    new = [p for p in compared if p != "the train split"]
    detail = "" if label_distance is None else (
        f"label distance {label_distance:.2f}, pixel shift "
        f"{'not compared' if shift is None else f'{shift:.2f}'}, at most {threshold:.2f}"
        + (f" (largest of the train split and the new {', '.join(new)})" if new else ""))
    return _check("drift", failures, detail, label_distance=label_distance, pixel_shift=shift,
                  threshold=threshold, measured=measured)


def validate(stats: dict[str, Any], *, rules: ValidationRules,
             reference: dict[str, Any] | None = None,
             rejected: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict on staged data's statistics: every check, and a reason per failure."""
    if not isinstance(rules, ValidationRules):
        raise ConfigError(f"rules must be a ValidationRules, got {type(rules).__name__}")
    checks = [_schema(stats, rules, reference), _examples_per_class(stats, rules),
              _duplicates(stats), _corrupt_files(rules, rejected),
              _drift(stats, rules, reference)]
    reasons = [f"{c['name']}: {c['detail']}" for c in checks if not c["passed"]]
    return {"passed": not reasons, "checks": checks, "reasons": reasons}


def require_valid(verdict: dict[str, Any]) -> dict[str, Any]:
    """``verdict`` if it passed; else ValidationError listing every reason, one a line."""
    if verdict["passed"]:
        return verdict
    reasons = verdict["reasons"]
    raise ValidationError(
        f"the staged data failed validation ({len(reasons)} of {len(verdict['checks'])} "
        f"checks failed); fix the data and stage it under a new version:\n"
        + "\n".join(reasons))
