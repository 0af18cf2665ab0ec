"""A tfds dataset that must be downloaded, on a machine that cannot reach its source.

Real tensorflow-datasets builders and download manager (``mnist`` itself, and a small
builder of this module served over HTTP on 127.0.0.1); the network is refused by this
process's sockets: every connection refused, names resolved or not. Nothing of tfds is
mocked.
"""

from __future__ import annotations

import errno
import http.server
import io
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from training.cli import main
from training.config import DatasetConfig
from training.data.snapshot import staging
from training.errors import DatasetError

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy",
                   "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def direct(monkeypatch):
    """No proxy in the environment: a download connects to its host itself."""
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def refuse_network(monkeypatch, how: str) -> None:
    """From now on, in this process: ``refused``, every name resolves (to a
    documentation address) and every connection is refused; ``unresolvable``, no name
    resolves, as on a machine without DNS."""

    def getaddrinfo(host, port, *args, **kwargs):
        if how == "unresolvable":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", int(port or 0)))]

    def connect(self, address):
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)


def listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.mark.parametrize("how", ["refused", "unresolvable"])
def test_an_offline_download_fails_in_seconds_naming_the_host_and_leaves_nothing(
        how, direct, monkeypatch, tmp_path, capsys, caplog):
    staging_dir = tmp_path / "datasets"
    (staging_dir / "downloads" / "cifar10").mkdir(parents=True)  # what was there stays
    (staging_dir / "digits").mkdir()
    (staging_dir / "digits" / "kept.txt").write_text("another dataset's file")
    before = listing(staging_dir)
    refuse_network(monkeypatch, how)

    started = time.monotonic()
    status = main(["stage", "--dataset", "mnist", "--staging-dir", os.fspath(staging_dir)])
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert status == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    reason = "ConnectionRefusedError" if how == "refused" else "gaierror"
    assert errors[0].startswith(
        "error: cannot download dataset 'mnist': this machine cannot reach "
        f"storage.googleapis.com:443 ({reason}: "), errors[0]
    assert errors[0].endswith(
        "stage it on a machine that can (python -m training stage --dataset mnist "
        f"--staging-dir DIR) and copy DIR/mnist into {staging_dir}: staging here then "
        "finds it prepared (docs/datasets.md)"), errors[0]
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]  # tfds's retries
    assert took < 30, took  # 205 s of retries before
    assert listing(staging_dir) == before
    # A file of the failed download that tfds's pool starts only now fails at once, not
    # after the plain downloader's 10 retries (before: it retried in the background, and
    # its "Retrying" landed in the next test's log, seen once in a whole-suite run).
    from tensorflow_datasets.core.download import downloader

    with pytest.raises(DatasetError, match="download of dataset 'mnist' abandoned: "
                                           "storage.googleapis.com:443 was not reached"):
        downloader._open_url("https://storage.googleapis.com/cvdf-datasets/mnist/"
                             "t10k-labels-idx1-ubyte.gz")


class ServedImages(tfds.core.GeneratorBasedBuilder):
    """A small image-classification dataset that tfds downloads from ``URL``."""

    VERSION = tfds.core.Version("1.0.0")
    URL = ""  # the test's server

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(4, 4, 1)),
                "label": tfds.features.ClassLabel(num_classes=2)}),
            supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        path = dl_manager.download(self.URL)
        return {"train": self._generate_examples(path, 0),
                "test": self._generate_examples(path, 1)}

    def _generate_examples(self, path, part):
        arrays = np.load(path)
        for i in range(part, len(arrays["labels"]), 2):
            yield i, {"image": arrays["images"][i], "label": int(arrays["labels"][i])}


@pytest.fixture
def flaky_server():
    """An HTTP server on 127.0.0.1 whose first answer is 503, then the dataset's file;
    ``.requests`` counts the GETs."""
    rng = np.random.default_rng(0)
    body = io.BytesIO()
    np.savez(body, images=rng.integers(0, 256, (40, 4, 4, 1), dtype=np.uint8),
             labels=np.arange(40) % 2)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            server.requests += 1
            status, data = (503, b"busy") if server.requests == 1 else (200, body.getvalue())
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.requests = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_host_that_answers_keeps_tfds_retries_and_a_copy_staged_elsewhere_is_used_offline(
        direct, flaky_server, monkeypatch, tmp_path):
    monkeypatch.setattr(ServedImages, "URL",
                        f"http://127.0.0.1:{flaky_server.server_address[1]}/images.npz")
    elsewhere, here = tmp_path / "elsewhere", tmp_path / "here"
    staged = staging.stage(DatasetConfig(name="served_images", staging_dir=os.fspath(elsewhere)))
    assert flaky_server.requests == 2  # the 503 was retried by tfds, as before

    # What the error line says to do: the dataset staged where its host answers,
    # copied here, is staged here with no network at all.
    here.mkdir()
    shutil.copytree(elsewhere / "served_images", here / "served_images")
    refuse_network(monkeypatch, "refused")
    again = staging.stage(DatasetConfig(name="served_images", staging_dir=os.fspath(here)))
    assert again.key == staged.key
    assert again.path == os.fspath(here / "served_images" / "1.0.0")
    assert not (here / "downloads").exists()
    staging.verify(again)
