"""A run's config built and checked once, then handed on frozen (training.config.frozen),
and the CLI's config built with each value checked once."""

from __future__ import annotations

import json
import os

import pytest
from support.config_checks import FieldChecks

from training.cli import build_parser, load_config
from training.config import RunConfig, frozen
from training.errors import ConfigError


def _config(tmp_path, **values) -> RunConfig:
    return RunConfig.from_flat({"output_dir": str(tmp_path / "runs"), "run_id": "night-1",
                                **values})


def test_a_frozen_config_thaws_to_the_same_config_checked_once_per_process(tmp_path,
                                                                          monkeypatch):
    cfg = _config(tmp_path, epochs=7)
    handed = frozen.freeze(cfg)
    assert handed["path"] == os.fspath(cfg.run_dir() / "run-config.json")
    checks = FieldChecks("fit.epochs", tmp_path, monkeypatch)
    assert frozen.thaw(handed) == cfg
    assert frozen.thaw(dict(handed)) is frozen.thaw(handed)
    assert checks.per_process() == {}  # this process froze these bytes: nothing to check

    frozen._BUILT.clear()  # as a task process that did not freeze it: checked once
    assert frozen.thaw(handed).fit.epochs == 7
    assert frozen.thaw(handed).fit.epochs == 7
    assert checks.per_process() == {str(os.getpid()): 1}


def test_a_frozen_config_changed_after_the_first_task_is_refused(tmp_path):
    cfg = _config(tmp_path, epochs=3)
    handed = frozen.freeze(cfg)
    path = cfg.run_dir() / "run-config.json"
    data = json.loads(path.read_text())
    data["fit"]["epochs"] = 30  # a valid config, not the one the run started with
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    with pytest.raises(ConfigError, match=r"frozen config .*run-config.json changed after "
                                          r"the run's first task wrote it \(SHA-256 "):
        frozen.thaw(handed)
    path.unlink()
    with pytest.raises(ConfigError, match="cannot be read"):
        frozen.thaw(handed)
    for malformed in ({"path": str(path)}, "run-config.json", None):
        with pytest.raises(ConfigError, match=r"frozen config handed on is .*, not its path "
                                              r"and SHA-256"):
            frozen.thaw(malformed)


def test_the_cli_checks_a_value_from_a_file_and_a_flag_once(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"fit": {"epochs": 4, "batch_size": 32}}))
    checks = FieldChecks("fit.epochs", tmp_path, monkeypatch)
    args = build_parser().parse_args(["train", "--config", str(config), "--epochs", "9"])
    cfg = load_config(args)
    assert (cfg.fit.epochs, cfg.fit.batch_size) == (9, 32)
    assert checks.per_process() == {str(os.getpid()): 1}
    with pytest.raises(ConfigError, match="unknown config key"):
        RunConfig.from_file(config, overrides={"epochz": 9})
