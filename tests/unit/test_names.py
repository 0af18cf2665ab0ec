"""The names a run is stored under are valid for any valid model, and the run claim a
parent hands its child survives any character a path may hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from training import locks
from training.config import RunConfig
from training.errors import ConfigError
from training.layout import NAME_PATTERN, as_name

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_model"


@pytest.mark.parametrize("text", [
    "digits-tiny_model:tiny_convnet", "manual__2026-11-30T19:21:27.341522+00:00",
    "_private:fn", "a..b", "...", "x" * 300, "é:ü/ß",
])
def test_any_text_becomes_a_valid_name_and_a_valid_one_stays(text):
    name = as_name(text)
    assert __import__("re").fullmatch(NAME_PATTERN, name), name
    assert as_name(name) == name  # valid names pass through unchanged
    assert as_name(text) == name  # the same text, the same name (a retry lands in place)


def test_two_long_texts_cut_to_the_same_head_keep_distinct_names():
    first, second = as_name("m" * 200 + ":a"), as_name("m" * 200 + ":b")
    assert first != second and len(first) <= 128 and len(second) <= 128


def test_a_module_function_model_gets_a_valid_default_model_name_and_run_id(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    cfg = RunConfig.from_flat({"model": "tiny_model:tiny_convnet"})
    assert cfg.model_name == "digits-tiny_model-tiny_convnet"
    assert cfg.run_id.startswith("digits-tiny_model-tiny_convnet-")
    assert ":" not in str(cfg.run_dir())
    # Built-in models keep the names they always had.
    plain = RunConfig.from_flat({"model": "mlp"})
    assert plain.model_name == "digits-mlp"
    assert plain.run_id == f"digits-mlp-{plain.fingerprint()}"


def test_a_given_model_name_or_run_id_that_breaks_the_rule_is_refused_as_config():
    with pytest.raises(ConfigError, match=r"storage.model_name must be empty, or a "
                                          r"registry name .* got 'digits:mine'"):
        RunConfig.from_flat({"model_name": "digits:mine"})


CHILD = """
import sys
from training import locks
with locks.claim(sys.argv[1], "the run"):
    print("claimed")
"""


def test_a_child_under_its_parents_claim_recognises_a_path_with_separators(tmp_path):
    # ':' is os.pathsep: a path holding it split into two when the claims were joined
    # with it, and the child saw its own parent's claim as someone else's.
    lock = tmp_path / "runs" / f"digits-m{os.pathsep}x-1" / "with,comma and\nnewline" / "run.lock"
    with locks.claim(lock, "the run"):
        env = {**os.environ, **locks.claimed_env(), "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", CHILD, str(lock)], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "claimed"
        # A process not handed the claim is refused, naming the holder.
        alone = {k: v for k, v in env.items() if k != locks.HELD_ENV}
        refused = subprocess.run([sys.executable, "-c", CHILD, str(lock)], env=alone,
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
        assert f"process {os.getpid()}" in refused.stderr
    assert not lock.exists()
