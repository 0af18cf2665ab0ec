"""The training image runs: ``docker run`` of it trains digits and publishes to a real S3
server (SeaweedFS, the production stack's), as a non-root user, with the config read
from a mounted file as a Kubernetes pod reads its ConfigMap; a bad config exits 2 with
one line. A plain boto3 reader then re-hashes every object of the published version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.prodstack import rehash

from training.config import RunConfig

CONFIG_DIR = "/etc/training"  # where the Job mounts its ConfigMap


def _data_dir(tmp_path: Path) -> Path:
    """A directory the image's user (uid 50000) may write, mounted at /data."""
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 50000, 0)
    return data


def _config_dir(tmp_path: Path, cfg: RunConfig | str) -> Path:
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "config.json").write_text(cfg if isinstance(cfg, str) else cfg.to_json())
    return folder


@pytest.mark.slow
def test_the_training_image_trains_digits_and_publishes_to_seaweedfs(images, s3_server,
                                                                     tmp_path):
    bucket = s3_server.create_bucket()
    cfg = RunConfig.from_flat({
        "staging_dir": "/data/datasets", "output_dir": "/data/runs",
        "store_uri": f"s3://{bucket}/registry", "run_id": "image-run", "epochs": 3,
        "backup_interval_s": 0, "strategy": "one_device"})
    data, config = _data_dir(tmp_path), _config_dir(tmp_path, cfg)
    aws_config = config / "aws-config"
    aws_config.write_text("[default]\ns3 =\n    addressing_style = path\n")
    env = {**s3_server.env(), "AWS_CONFIG_FILE": f"{CONFIG_DIR}/aws-config"}

    # Host networking: the container reaches the S3 server on 127.0.0.1, nothing else.
    done = images.docker(
        "run", "--rm", "--network", "host", "--name", f"training-image-{os.getpid()}",
        *[arg for key, value in env.items() for arg in ("--env", f"{key}={value}")],
        "--volume", f"{config}:{CONFIG_DIR}:ro", "--volume", f"{data}:/data",
        images.training, "run", "--config", f"{CONFIG_DIR}/config.json",
        check=False, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    published = next(json.loads(line)["published"] for line in done.stdout.splitlines()
                     if line.startswith('{"published"'))
    version = published["version"]

    # What a reader with nothing but boto3 sees: every file of the version, re-hashed.
    manifest = rehash(s3_server.client(), version, model=cfg.model_name,
                      bucket=bucket)
    assert "model.keras" in {entry["path"] for entry in manifest["files"]}
    # Written by the image's user, not root: the run directory on the mounted volume.
    run_dir = data / "runs" / "image-run"
    assert run_dir.is_dir()
    assert {p.stat().st_uid for p in run_dir.rglob("*")} == {50000}
    user = images.docker("image", "inspect", "--format", "{{.Config.User}}", images.training)
    assert user.stdout.strip() == "50000"


@pytest.mark.slow
def test_a_bad_config_exits_2_with_one_line_naming_the_field(images, tmp_path):
    cfg = json.loads(RunConfig().to_json())
    cfg["fit"]["epochs"] = 0
    config = _config_dir(tmp_path, json.dumps(cfg))
    done = images.docker("run", "--rm", "--network", "none", "--volume",
                         f"{config}:{CONFIG_DIR}:ro", images.training, "train", "--config",
                         f"{CONFIG_DIR}/config.json", check=False, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "epochs" in lines[0] and "got 0" in lines[0], lines
