"""Validation of staged data (training/data/snapshot/statistics.py, validation.py) on small real
tfds datasets, prepared in a temporary directory: every rule passing and failing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tensorflow_datasets as tfds

from training.data.snapshot.splits import split_names
from training.data.snapshot.statistics import dataset_statistics
from training.data.snapshot.validation import ValidationRules, require_valid, validate
from training.errors import ConfigError, DatasetError, ValidationError

NAMES = ["cat", "dog", "bird"]
WHOLE = {"train": "train", "test": "test"}  # every example, in a known split
RULES = ValidationRules(min_examples_per_class=5, max_corrupt_fraction=0.1,
                        drift_threshold=0.2)


class Tiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """An image-classification dataset from arrays handed to the constructor."""

    VERSION = tfds.core.Version("1.0.0")
    pkg_dir_path = tfds.core.Path(__file__).parent  # tfds looks for metadata files here

    def __init__(self, *, examples, names=NAMES, shape=(8, 8, 1), **kwargs):
        self._examples, self._names, self._shape = examples, names, shape
        super().__init__(**kwargs)

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=self._shape),
                "label": tfds.features.ClassLabel(names=self._names),
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(items) for split, items in self._examples.items()}

    def _generate_examples(self, items):
        images, labels = items
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            yield i, {"image": image, "label": int(label)}


def _images(n, low, high, seed):
    return np.random.default_rng(seed).integers(low, high, (n, 8, 8, 1), dtype=np.uint8)


def _balanced(n):
    return np.arange(n) % len(NAMES)


def _data(seed, *, low=0, high=128, train_labels=None):
    labels = _balanced(60) if train_labels is None else np.asarray(train_labels)
    return {"train": (_images(len(labels), low, high, seed), labels),
            "test": (_images(15, low, high, seed + 100), _balanced(15))}


@pytest.fixture(scope="module")
def prepare(tmp_path_factory):
    tfds.disable_progress_bar()

    def prepare(examples, **kwargs):
        builder = Tiny(examples=examples, data_dir=str(tmp_path_factory.mktemp("tfds")),
                       **kwargs)
        builder.download_and_prepare()
        return builder

    return prepare


@pytest.fixture(scope="module")
def data():
    return {"base": _data(1), "reference": _data(2), "shifted": _data(3, low=128, high=256),
            "skewed": _data(4, train_labels=[0] * 54 + [1, 2] * 3)}


@pytest.fixture(scope="module")
def stats(prepare, data):
    return {name: dataset_statistics(prepare(examples), WHOLE)
            for name, examples in data.items()}


def _check(verdict, name):
    return next(c for c in verdict["checks"] if c["name"] == name)


def test_statistics_count_classes_and_measure_pixels_exactly(stats, data):
    base, (images, _) = stats["base"], data["base"]["train"]
    assert base["label_names"] == NAMES and base["num_classes"] == 3
    assert base["image_shape"] == [8, 8, 1] and base["image_dtype"] == "uint8"
    train = base["splits"]["train"]
    assert train["num_examples"] == 60 and train["class_counts"] == [20, 20, 20]
    assert base["splits"]["test"]["class_counts"] == [5, 5, 5]
    assert train["pixel_mean"] == [pytest.approx(float(images.mean()), abs=1e-9)]
    assert train["pixel_std"] == [pytest.approx(float(images.std()), abs=1e-9)]
    assert base["duplicates"] == {"count": 0, "within_split": 0, "examples": []}
    assert json.loads(json.dumps(base)) == base  # JSON as it is: XCom, a stored reference


def test_statistics_follow_the_split_expressions_of_input(prepare, data):
    builder = prepare(data["base"])
    splits = split_names(builder, 0.1)
    stats = dataset_statistics(builder, splits)
    assert {n: s["split"] for n, s in stats["splits"].items()} == splits
    sizes = {n: s["num_examples"] for n, s in stats["splits"].items()}
    assert sizes == {"train": 54, "validation": 6, "test": 15}
    counts = np.add(stats["splits"]["train"]["class_counts"],
                    stats["splits"]["validation"]["class_counts"])
    assert counts.tolist() == [20, 20, 20]


def test_images_of_different_shapes_are_an_error(prepare):
    images = [np.zeros((8, 8, 1), np.uint8), np.zeros((9, 8, 1), np.uint8)]
    builder = prepare({"train": (images, [0, 1]), "test": (images[:1], [0])},
                      shape=(None, None, 1))
    with pytest.raises(DatasetError, match=r"split 'train' \(train\) holds images of "
                                           r"different shapes: \[8, 8, 1\] \(index \d\) and "
                                           r"\[9, 8, 1\]"):
        dataset_statistics(builder, WHOLE)


def test_same_distribution_passes_every_check(stats):
    verdict = validate(stats["base"], rules=RULES, reference=stats["reference"])
    assert verdict["passed"] and verdict["reasons"] == []
    assert [c["name"] for c in verdict["checks"]] == [
        "schema", "examples_per_class", "duplicates", "corrupt_files", "drift"]
    drift = _check(verdict, "drift")
    assert drift["label_distance"] == 0.0 and drift["pixel_shift"] < 0.05
    assert drift["threshold"] == 0.2
    assert json.loads(json.dumps(verdict)) == verdict
    assert validate(json.loads(json.dumps(stats["base"])), rules=RULES,
                    reference=json.loads(json.dumps(stats["reference"]))) == verdict
    assert require_valid(verdict) is verdict


def test_without_production_drift_is_not_compared(stats):
    drift = _check(validate(stats["shifted"], rules=RULES), "drift")
    assert drift["passed"] and drift["detail"] == "no production data to compare"


def test_a_shifted_pixel_distribution_is_drift(stats, data):
    verdict = validate(stats["shifted"], rules=RULES, reference=stats["reference"])
    mine, ref = data["shifted"]["train"][0], data["reference"]["train"][0]
    expected = min(1.0, abs(float(mine.mean()) - float(ref.mean())) / float(ref.std()) / 2)
    drift = _check(verdict, "drift")
    assert not verdict["passed"] and not drift["passed"]
    assert drift["pixel_shift"] == pytest.approx(expected, abs=1e-9) and expected > 0.5
    assert drift["label_distance"] == 0.0
    assert verdict["reasons"] == [
        f"drift: pixel mean moved by {expected:.2f} (largest channel shift in production's "
        "standard deviations, divided by 2), more than the threshold 0.20"]


def test_a_skewed_label_distribution_is_drift(stats):
    from scipy.spatial.distance import jensenshannon

    verdict = validate(stats["skewed"], rules=ValidationRules(
        min_examples_per_class=3, max_corrupt_fraction=0.1, drift_threshold=0.2),
        reference=stats["reference"])
    expected = float(jensenshannon([54, 3, 3], [20, 20, 20], base=2))
    drift = _check(verdict, "drift")
    assert drift["label_distance"] == pytest.approx(expected, abs=1e-12) and expected > 0.2
    assert drift["pixel_shift"] < 0.05
    assert verdict["reasons"] == [f"drift: label distribution moved by {expected:.2f} "
                                  "(Jensen-Shannon distance), more than the threshold 0.20"]
    loose = ValidationRules(min_examples_per_class=3, max_corrupt_fraction=0.1,
                            drift_threshold=0.9)
    assert validate(stats["skewed"], rules=loose, reference=stats["reference"])["passed"]


def test_a_class_below_the_minimum_is_named_with_its_count(stats):
    verdict = validate(stats["skewed"], rules=RULES)
    check = _check(verdict, "examples_per_class")
    assert not check["passed"] and check["below_minimum"] == {"dog": 3, "bird": 3}
    assert check["class_counts"] == {"cat": 54, "dog": 3, "bird": 3}
    assert verdict["reasons"] == ["examples_per_class: 2 of 3 classes have fewer than 5 "
                                  "train examples: 'dog' 3, 'bird' 3"]
    at_minimum = ValidationRules(min_examples_per_class=3, max_corrupt_fraction=0.1,
                                 drift_threshold=0.2)
    assert validate(stats["skewed"], rules=at_minimum)["passed"]


def test_a_missing_and_a_new_class_against_production_fail_the_schema(prepare, stats):
    other = dataset_statistics(prepare(_data(5), names=["cat", "dog", "fish"]), WHOLE)
    verdict = validate(other, rules=RULES, reference=stats["reference"])
    schema = _check(verdict, "schema")
    assert schema["missing_labels"] == ["bird"] and schema["new_labels"] == ["fish"]
    assert verdict["reasons"][0] == ("schema: labels differ from production's: missing "
                                     "'bird'; new 'fish'")
    assert _check(validate(other, rules=RULES, reference=other), "schema")["passed"]


def test_the_same_labels_in_another_order_fail_the_schema(prepare, stats):
    other = dataset_statistics(prepare(_data(6), names=["dog", "cat", "bird"]), WHOLE)
    verdict = validate(other, rules=RULES, reference=stats["reference"])
    assert verdict["reasons"] == [
        "schema: labels are production's in another order (class 0 is 'dog' here, 'cat' in "
        "production): a class index must mean the same class"]


def test_a_wrong_shape_fails_the_schema(stats):
    wrong = ValidationRules(min_examples_per_class=5, max_corrupt_fraction=0.1,
                            drift_threshold=0.2, expected_shape=(8, 8, 3))
    verdict = validate(stats["base"], rules=wrong)
    assert verdict["reasons"] == ["schema: images are 8x8x1, expected 8x8x3 (height x width "
                                  "x channels, rules.expected_shape)"]
    right = ValidationRules(min_examples_per_class=5, max_corrupt_fraction=0.1,
                            drift_threshold=0.2, expected_shape=[8, 8, 1])
    assert right.expected_shape == (8, 8, 1) and validate(stats["base"], rules=right)["passed"]


def test_an_image_in_train_and_test_is_leakage(prepare, data):
    (train, labels), (test, test_labels) = data["base"]["train"], data["base"]["test"]
    train, test = train.copy(), test.copy()
    test[0] = train[3]  # the same image in train and test
    train[6] = train[5]  # a repeat inside train: not leakage
    builder = prepare({"train": (train, labels), "test": (test, test_labels)})
    stats = dataset_statistics(builder, WHOLE)
    found = stats["duplicates"]
    assert found["count"] == 1 and found["within_split"] == 1
    [[(first, i), (second, j)]] = found["examples"]
    assert (first, second) == ("train", "test")
    read = {n: [x for x, _ in tfds.as_numpy(builder.as_dataset(split=n, as_supervised=True))]
            for n in WHOLE}
    assert np.array_equal(read["train"][i], read["test"][j])
    assert np.array_equal(read["test"][j], test[0])
    verdict = validate(stats, rules=RULES)
    assert verdict["reasons"] == [
        f"duplicates: 1 example repeats an image of another split (leakage between train, "
        f"validation and test), e.g. train #{i} = test #{j}"]


def test_corrupt_files_over_the_tolerance_fail_and_are_listed(stats):
    rejected = [{"path": f"cats/{n}.png", "reason": "truncated PNG"} for n in range(12)]
    verdict = validate(stats["base"], rules=RULES,
                       rejected={"rejected": rejected, "attempted": 72})
    check = _check(verdict, "corrupt_files")
    assert not check["passed"] and check["count"] == 12 and check["rejected"] == rejected
    assert check["fraction"] == pytest.approx(12 / 72)
    [reason] = verdict["reasons"]
    listed = ", ".join(f"cats/{n}.png (truncated PNG)" for n in range(10))
    assert reason == ("corrupt_files: 12 of 72 files (16.7%) could not be decoded, more than "
                      f"max_corrupt_fraction 10.0%: {listed} and 2 more")
    few = validate(stats["base"], rules=RULES,
                   rejected={"rejected": rejected[:3], "attempted": 72})
    check = _check(few, "corrupt_files")
    assert few["passed"] and check["count"] == 3 and check["rejected"] == rejected[:3]


def test_a_reason_stays_one_line_whatever_a_path_holds(stats):
    rejected = {"rejected": [{"path": "a\nb.png", "reason": "bad\r\nPNG"}], "attempted": 1}
    [reason] = validate(stats["base"], rules=RULES, rejected=rejected)["reasons"]
    assert reason.splitlines() == [reason] and "a\\nb.png (bad\\r\\nPNG)" in reason


def test_a_malformed_rejected_report_is_an_error(stats):
    with pytest.raises(DatasetError, match="rejected must be .* got {'rejected': \\[\\]}"):
        validate(stats["base"], rules=RULES, rejected={"rejected": []})
    with pytest.raises(DatasetError, match="N at least the number rejected"):
        validate(stats["base"], rules=RULES,
                 rejected={"rejected": [{"path": "a.png"}], "attempted": 0})


def test_require_valid_lists_every_reason_one_a_line(stats):
    wrong = ValidationRules(min_examples_per_class=5, max_corrupt_fraction=0.1,
                            drift_threshold=0.2, expected_shape=(8, 8, 3))
    verdict = validate(stats["skewed"], rules=wrong, reference=stats["reference"])
    assert len(verdict["reasons"]) == 3
    with pytest.raises(ValidationError) as raised:
        require_valid(verdict)
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("the staged data failed validation (3 of 5 checks failed)")
    assert lines[1:] == verdict["reasons"]
    assert isinstance(raised.value, DatasetError)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("min_examples_per_class", -1, "min_examples_per_class must be an integer, at least 0, "
                                   "got -1 (int)"),
    ("min_examples_per_class", True, "min_examples_per_class must be an integer, at least 0, "
                                     "got True (bool)"),
    ("max_corrupt_fraction", 1.5, "max_corrupt_fraction must be a number between 0 and 1, "
                                  "got 1.5 (float)"),
    ("max_corrupt_fraction", math.nan, "max_corrupt_fraction must be a number between 0 and "
                                       "1, got nan (float)"),
    ("drift_threshold", 0, "drift_threshold must be a number greater than 0 (the largest "
                           "allowed drift distance, at most 1 to ever fail), got 0 (int)"),
    ("drift_threshold", "0.2", "drift_threshold must be a number greater than 0"),
    ("expected_shape", (8, 8), "expected_shape must be None or three positive integers "
                               "(height, width, channels), got (8, 8)"),
])
def test_rules_refuse_bad_values_naming_field_value_and_what_is_allowed(field, value, message):
    values = {"min_examples_per_class": 1, "max_corrupt_fraction": 0.0, "drift_threshold": 1,
              field: value}
    with pytest.raises(ConfigError) as raised:
        ValidationRules(**values)
    assert str(raised.value).startswith(message)


def test_a_new_day_is_checked_for_drift_on_its_own_and_an_old_day_is_not(stats):
    """A team's data: the train split hardly moves when one new day of three is
    skewed, but that day compared alone with production's train split does."""
    reference = json.loads(json.dumps(stats["reference"]))
    ref_train = reference["splits"]["train"]
    day = {"num_examples": 30, "class_counts": list(ref_train["class_counts"]),
           "pixel_mean": list(ref_train["pixel_mean"]),
           "pixel_std": list(ref_train["pixel_std"])}
    reference["partitions"] = {"dt=2026-11-28": day}
    skewed = {**day, "class_counts": [30] + [0] * (len(day["class_counts"]) - 1)}
    mine = {**reference, "partitions": {"dt=2026-11-28": day, "dt=2026-11-29": day,
                                        "dt=2026-11-30": skewed}}
    verdict = validate(mine, rules=RULES, reference=reference)
    drift = _check(verdict, "drift")
    assert not drift["passed"]
    assert set(drift["measured"]) == {"the train split", "dt=2026-11-29", "dt=2026-11-30"}
    assert drift["measured"]["the train split"]["label_distance"] == 0.0
    assert drift["measured"]["dt=2026-11-29"]["label_distance"] == 0.0
    assert verdict["reasons"] == [
        f"drift: dt=2026-11-30: label distribution moved by "
        f"{drift['measured']['dt=2026-11-30']['label_distance']:.2f} (Jensen-Shannon "
        "distance), more than the threshold 0.20"]
    # Once production was trained on that day too, it is not new: not compared alone.
    reference["partitions"]["dt=2026-11-30"] = skewed
    again = _check(validate(mine, rules=RULES, reference=reference), "drift")
    assert set(again["measured"]) == {"the train split", "dt=2026-11-29"}
