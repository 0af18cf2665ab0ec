"""``python -m training models show`` checks a real stored version as promotion does.

The session's trained run is published as a version of a local store and of a bucket
on the session's SeaweedFS; the CLI runs in a real subprocess, as a user runs it, and a
byte of the stored ``model.keras`` is flipped and another file deleted behind the
store's back.
"""

from __future__ import annotations

import json
import os

import pytest
from support.cli import cli, one_error_line

from training import layout
from training.errors import ERROR_EXIT
from training.registry import open_store
from training.registry.local import FileStore
from training.registry.versions import ModelRegistry

pytestmark = pytest.mark.slow

NAME, VERSION = "shown", "v1"


@pytest.fixture(params=["file", "s3"])
def stored(request, trained_run, tmp_path):
    """The trained run's model directory published as ``shown``/``v1``: (the store,
    its URI, the environment a subprocess reaches it with, the manifest)."""
    cfg, _ = trained_run
    if request.param == "file":
        uri, options, env = os.fspath(tmp_path / "store"), None, {}
    else:
        server = request.getfixturevalue("s3_server")
        config = tmp_path / "aws-config"
        config.write_text("[default]\ns3 =\n    addressing_style = path\n")
        uri, options = f"s3://{server.create_bucket()}/registry", server.options()
        env = {**server.env(), "AWS_CONFIG_FILE": os.fspath(config)}
    store = open_store(uri, options)
    manifest = ModelRegistry(store).publish(
        NAME, VERSION, layout.model_dir(cfg.run_dir()), run_id=cfg.run_id,
        created="2026-12-01T00:00:00+00:00")
    return store, uri, env, manifest


def _delete(store, key: str) -> None:
    """Remove the stored object ``key``, behind the store's back."""
    if isinstance(store, FileStore):
        store.root.joinpath(*key.split("/")).unlink()
    else:
        store._client.delete_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}")


def test_show_verifies_every_file_and_names_each_bad_one(stored, corrupt, tmp_path):
    store, uri, env, manifest = stored

    def models(action: str, *args: str):
        return cli(tmp_path, "models", action, "--store-uri", uri, "--name", NAME,
                   "--version", VERSION, *args, env=env)

    whole = models("show")
    assert whole.returncode == 0, whole.stderr[-2000:]
    shown = json.loads(whole.stdout)
    assert shown["verified"] is True
    assert shown["verified_files"] == len(manifest["files"]) > 2
    assert shown["files"] == manifest["files"] and shown["production"] is False

    paths = [entry["path"] for entry in manifest["files"]]
    missing = layout.CONFIG if layout.CONFIG in paths else paths[0]
    corrupt(store, layout.version_key(NAME, VERSION, layout.MODEL_FILE))
    _delete(store, layout.version_key(NAME, VERSION, missing))
    damaged = models("show")
    assert damaged.returncode == ERROR_EXIT, damaged.stderr[-2000:]
    assert damaged.stdout == "" and "Traceback" not in damaged.stderr
    errors = [line for line in damaged.stderr.splitlines() if line.startswith("error: ")]
    where = "error: file {!r} of model 'shown' version 'v1' is "
    assert len(errors) == 2, damaged.stderr[-2000:]  # one line per bad file
    assert any(e.startswith(where.format(layout.MODEL_FILE) + "corrupt: ") for e in errors)
    assert any(e.startswith(where.format(missing) + "missing from the store: ")
               for e in errors)

    # A version too large to read back: the manifest, said to be unverified.
    skipped = models("show", "--no-verify")
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    unverified = json.loads(skipped.stdout)
    assert unverified["verified"] is False and "--no-verify" in unverified["verification"]
    assert unverified["files"] == manifest["files"] and "verified_files" not in unverified

    # promote refuses the same version, and --no-verify does not apply to it.
    refused = models("promote", "--reason", "by hand")
    assert refused.returncode == ERROR_EXIT
    assert "refusing to promote model 'shown' version 'v1'" in one_error_line(refused)
    careless = models("promote", "--reason", "by hand", "--no-verify")
    assert careless.returncode == 2
    assert "--no-verify applies to models show only" in one_error_line(careless)
    assert ModelRegistry(store).production(NAME) is None
