"""``staging.cached``: the Airflow task's cache hit, found without tfds or TensorFlow,
and every case where it must leave the work to ``stage`` (which loads them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from training.config import DatasetConfig
from training.data.snapshot import staging
from training.data.sources.catalog import DEFAULT_VERSION_RECORD, OFFLINE_VERSIONS, default_version
from training.errors import DatasetError
from training.layout import STAGING_MANIFEST


@pytest.fixture
def copied(staged_digits, tmp_path) -> Path:
    """A staging directory of its own holding the staged digits (and their records)."""
    root = tmp_path / "datasets"
    shutil.copytree(Path(staged_digits.staging_dir) / "digits", root / "digits")
    return root


def test_a_cache_hit_is_found_in_a_process_that_never_loads_tensorflow(staged_digits):
    code = ("import json, sys\nfrom training.config import DatasetConfig\n"
            "from training.data.snapshot import staging\n"
            f"hit = staging.cached(DatasetConfig(staging_dir={staged_digits.staging_dir!r}))\n"
            "print(json.dumps(hit.to_dict()))\n"
            "print(sorted(m for m in ('tensorflow', 'tensorflow_datasets', 'keras')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    hit, loaded = done.stdout.splitlines()
    assert json.loads(hit) == staged_digits.to_dict()
    assert loaded == "[]"


def test_the_digits_version_known_without_tfds_is_the_builders(staged_digits):
    assert staged_digits.version == OFFLINE_VERSIONS["digits"]


def test_a_tampered_manifest_is_refused_not_taken_for_a_hit(copied):
    path = copied / "digits" / OFFLINE_VERSIONS["digits"] / STAGING_MANIFEST
    manifest = json.loads(path.read_text())
    shard = next(e for e in manifest["files"] if ".tfrecord" in e["path"])
    shard["sha256"] = "0" * 64  # the listed shard is not the one fingerprinted
    path.write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="its fingerprint is not the one of the files"):
        staging.cached(DatasetConfig(staging_dir=str(copied)))


def test_other_content_under_a_staged_name_and_version_is_refused(copied):
    record = copied / "digits" / f"{OFFLINE_VERSIONS['digits']}.fingerprint"
    record.write_text("0123456789abcdef\n")  # staged before with other content
    with pytest.raises(DatasetError, match="the content changed under the same name"):
        staging.cached(DatasetConfig(staging_dir=str(copied)))


def test_work_left_to_stage_is_not_a_hit(copied, tmp_path):
    # Statistics for another validation fraction: stage computes them, then it hits.
    other = DatasetConfig(staging_dir=str(copied), validation_fraction=0.25)
    assert staging.cached(other) is None
    assert staging.stage(other).fingerprint == staging.cached(other).fingerprint
    # Nothing staged there at all, and a version never staged.
    assert staging.cached(DatasetConfig(staging_dir=str(tmp_path / "empty"))) is None
    assert staging.cached(DatasetConfig(staging_dir=str(copied), version="9.9.9")) is None
    # A manifest of an older format: stage upgrades it after checking every file.
    path = copied / "digits" / OFFLINE_VERSIONS["digits"] / STAGING_MANIFEST
    manifest = json.loads(path.read_text())
    manifest["format"] = 1
    path.write_text(json.dumps(manifest))
    assert staging.cached(DatasetConfig(staging_dir=str(copied))) is None


def test_an_unversioned_catalog_dataset_resolves_only_with_the_same_tfds(tmp_path):
    assert default_version("mnist", tmp_path) is None  # never staged here
    record = tmp_path / "mnist" / DEFAULT_VERSION_RECORD
    record.parent.mkdir()
    record.write_text(json.dumps({"version": "3.0.1",
                                  "tensorflow_datasets": version("tensorflow-datasets")}))
    assert default_version("mnist", tmp_path) == "3.0.1"
    record.write_text(json.dumps({"version": "3.0.1", "tensorflow_datasets": "4.0.0"}))
    assert default_version("mnist", tmp_path) is None  # another tfds may pick another
