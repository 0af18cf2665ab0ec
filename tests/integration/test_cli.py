"""``python -m training`` as a user runs it: real subprocesses in an empty directory."""

import json
from pathlib import Path

import pytest
from support.cli import cli, last_json

pytestmark = pytest.mark.slow


def test_main_command_trains_the_seed_mlp_on_digits_to_95_percent(tmp_path):
    proc = cli(tmp_path, "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout, "evaluation")
    assert result["test_accuracy"] >= 0.95
    assert "Epoch 1/30" in proc.stdout  # progress is visible
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1
    evaluation = json.loads((run_dirs[0] / "model" / "evaluation.json").read_text())
    challenger = evaluation["challenger"]
    assert challenger["accuracy"] == result["test_accuracy"]
    assert len(challenger["confusion_matrix"]) == 10
    assert {"precision", "recall", "f1"} <= set(challenger["per_class"][0])
    # The first model is published and promoted, and says why.
    promotion = last_json(proc.stdout, "promotion")["promotion"]
    assert promotion["promoted"] is True
    assert "no model in production" in " ".join(promotion["reasons"])
    listed = cli(tmp_path, "models", "list")
    production = json.loads(listed.stdout)["digits-mlp"]["production"]
    assert production == run_dirs[0].name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "0"], "fit.epochs must be between 1 and 1000, got 0"),
        (["--batch-size", "-1"], "fit.batch_size must be between 1 and 65536, got -1"),
        (["--dataset", "nope"], "dataset.name must be 'digits' or a tensorflow-datasets "
                                "image-classification dataset (e.g. mnist, fashion_mnist, "
                                "cifar10), got 'nope'"),
        (["--model", "nope"], "model.name 'nope' is not a model: built in mlp, cnn, "
                              "mobilenet_v3_small, efficientnet_b0, resnet50; installed "
                              "(none); or a reference like my_pkg.models:build"),
        (["--config", "cfg.json"], "unknown config key fit.epoch; allowed: epochs"),
    ],
)
def test_bad_input_exits_nonzero_with_one_line_and_writes_nothing(tmp_path, args, message):
    (tmp_path / "cfg.json").write_text(json.dumps({"fit": {"epoch": 3}}))
    proc = cli(tmp_path, "run", *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {message}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.json"]


def test_stage_twice_is_a_cache_hit_and_a_flipped_byte_stops_training(tmp_path):
    first = cli(tmp_path, "stage")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "preparing into" in first.stderr
    second = cli(tmp_path, "stage")
    assert "cache hit" in second.stderr and "preparing" not in second.stderr
    assert last_json(first.stdout) == last_json(second.stdout)

    # What the DAG does: train takes the staged dataset that stage printed (its XCom),
    # verifies it and does not stage again.
    staged_file = tmp_path / "staged.json"
    staged_file.write_text(json.dumps(last_json(first.stdout)))
    shard = next(Path(tmp_path, "var/datasets/digits/1.0.0").glob("digits-train.tfrecord-*"))
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = cli(tmp_path, "train", "--epochs", "1", "--staged", str(staged_file))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: staged file {shard.relative_to(tmp_path)} is corrupted")
    assert "cache hit" not in proc.stderr and "preparing" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_staged_file_of_another_dataset_is_refused(tmp_path, capsys):
    from training.cli import main

    staged = {"name": "digits", "version": "1.0.0", "path": str(tmp_path / "d"),
              "staging_dir": str(tmp_path), "fingerprint": "ab" * 32}
    (tmp_path / "staged.json").write_text(json.dumps({"staged": staged}))
    (tmp_path / "broken.json").write_text('{"staged": {"name": "digits"}}')
    argv = ["train", "--output-dir", str(tmp_path / "runs"), "--staged"]
    assert main([*argv, str(tmp_path / "staged.json"), "--dataset", "mnist"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --staged {tmp_path / 'staged.json'} holds dataset 'digits:1.0.0@{'ab' * 32}', "
        "but the config asks for 'mnist': stage this config's dataset, or leave --staged out")
    assert main([*argv, str(tmp_path / "broken.json")]) == 2
    assert f"error: --staged {tmp_path / 'broken.json'} is not a staged dataset" in (
        capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()


def test_every_command_has_help_with_every_flag(tmp_path):
    for command in ("stage", "train", "evaluate", "run"):
        proc = cli(tmp_path, command, "--help")
        assert proc.returncode == 0
        for flag in ("--config", "--epochs", "--batch-size", "--dataset", "--model",
                     "--strategy", "--lr-scaling", "--restore-best-weights", "--store-uri"):
            assert flag in proc.stdout, (command, flag)
