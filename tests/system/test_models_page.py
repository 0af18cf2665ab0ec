"""System: the Models page plugin in a real Airflow api-server.

A store on the session's S3 server (SeaweedFS, which checks every signature) gets two
models: one with three versions (two with a report, two promotions and a rejection), one
never promoted. An ``airflow api-server`` on 127.0.0.1 loads ``plugins/`` with the
SimpleAuthManager (a ``viewer`` and a ``user``), a stand-in ``promote_model`` DAG, and an
``aws_default`` connection with keys made up for that S3 server (no AWS_* variable: the
page reads the store with the connection's keys only). This module holds that site, one
per session, shared with ``test_models_page_actions.py``, and the listing's tests.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape
from support.s3server import free_port

from training.registry import open_store
from training.registry.versions import ModelRegistry

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
USER = "modeler"
STARTUP_TIMEOUT_S = 150.0
MODEL = "digits-mlp"
OTHER_MODEL = "digits-cnn"
# (version, created, metrics, with a report); published in this order.
VERSIONS = [
    ("20250101-a", "2025-01-01T00:00:00+00:00",
     {"accuracy": 0.9134, "loss": 0.3012, "macro_f1": 0.9101}, True),
    ("20250102-b", "2025-01-02T00:00:00+00:00",
     {"accuracy": 0.9512, "loss": 0.1890, "macro_f1": 0.9497}, True),
    ("20250103-c", "2025-01-03T00:00:00+00:00",
     {"accuracy": 0.9020, "loss": 0.3304, "macro_f1": 0.8987}, False),
]
PRODUCTION = "20250102-b"
DECISION = "challenger accuracy 0.9512 beats the champion by 0.0378 >= 0.005"
# What each version's evaluation.json says beyond its metrics: its dataset, its holdout
# accuracy (None: evaluated without a holdout); and one setting of its config.json.
DATASETS = {"20250101-a": "digits:1.0.0@b504be350b053dde",
            "20250102-b": "digits:1.0.0@b504be350b053dde",
            "20250103-c": "digits:1.1.0@0c77a1f2e9d4b311"}
HOLDOUT = {"20250101-a": None, "20250102-b": 0.9388, "20250103-c": 0.8811}
EPOCHS = {"20250101-a": 4, "20250102-b": 6, "20250103-c": 8}
RELEASER, REVIEWER = "releaser", "reviewer"  # an Airflow user who may trigger DAGs; a name
REJECTION = "holdout accuracy fell by 0.0577"
_FOREIGN_PREFIXES = ("AIRFLOW_", "AIRFLOW__", "TRAINING_", "AWS_", "_AIRFLOW")


# --------------------------------------------------------------------------- the store


def config_of(version: str) -> dict[str, Any]:
    """A version's effective settings, as its run writes them (``config.json``)."""
    return {"model": {"name": "mlp", "args": {"hidden_units": [64]}},
            "fit": {"epochs": EPOCHS[version], "batch_size": 32, "learning_rate": 0.001},
            "storage": {"model_name": MODEL}}


def write_report(directory: Path, version: str, metrics: dict[str, float],
                 champion: dict[str, Any] | None, reason: str, *, build: bool) -> None:
    """The version's records and, if ``build``, its report by ``training.report``."""
    from training.report import build_report

    epochs = range(6)
    history = {
        "epochs": [e + 1 for e in epochs],
        "metrics": {"loss": [1.2 / (e + 1) for e in epochs],
                    "accuracy": [0.6 + 0.06 * e for e in epochs],
                    "val_loss": [1.3 / (e + 1) for e in epochs],
                    "val_accuracy": [0.58 + 0.06 * e for e in epochs],
                    "learning_rate": [1e-3] * 4 + [5e-4] * 2},
        "lr_reduced_at_epochs": [5],
        "early_stopping": {"monitor": "val_loss", "stopped_epoch": None, "best_epoch": 6,
                           "best_value": 0.2167, "restored_best_weights": True},
    }
    evaluation = {
        "model_name": MODEL,
        "version": version,
        "dataset": DATASETS[version],
        "challenger": {
            **metrics, "examples": 30,
            "per_class": [{"class": c, "precision": 0.9, "recall": 0.9, "f1": 0.9,
                           "support": 10} for c in range(3)],
            "confusion_matrix": [[9, 1, 0], [0, 10, 0], [1, 0, 9]],
        },
        "champion": champion,
        "policy": {"min_accuracy": 0.5, "min_improvement": 0.005, "force_promote": False},
        "decision": {"promote": True, "forced": False, "reasons": [reason]},
    }
    if HOLDOUT[version] is not None:
        evaluation["holdout"] = {"uri": "file:///holdout", "examples": 20,
                                 "challenger": {"accuracy": HOLDOUT[version]}, "champion": None}
    for name, record in (("history.json", history), ("evaluation.json", evaluation),
                         ("config.json", config_of(version))):
        (directory / name).write_text(json.dumps(record))
    if build:
        build_report(directory)


def fill_store(registry: ModelRegistry, work: Path) -> None:
    champion = None
    for version, created, metrics, with_report in VERSIONS:
        directory = work / version
        directory.mkdir(parents=True)
        (directory / "model.keras").write_bytes(f"weights of {version}".encode())
        reason = DECISION if version == PRODUCTION else "no model in production"
        write_report(directory, version, metrics, champion, reason, build=with_report)
        champion = champion or {"version": version, **metrics}
        registry.publish(MODEL, version, directory, run_id=f"manual__{created}",
                         created=created, metrics=metrics)
    registry.promote(MODEL, "20250101-a", run_id="manual__2025-01-01T00:00:00+00:00",
                     at="2025-01-01T00:10:00+00:00", reason="first version")
    registry.promote(MODEL, PRODUCTION, run_id="manual__2025-01-02T00:00:00+00:00",
                     at="2025-01-02T00:10:00+00:00",
                     reason="accuracy 0.9512 beats 0.9134 by 0.0378 >= 0.005", by=RELEASER)
    registry.record_decision(MODEL, "20250103-c", action="rejected",
                             run_id="manual__2025-01-03T00:00:00+00:00",
                             at="2025-01-03T00:20:00+00:00", reason=REJECTION, by=REVIEWER)
    other = work / "other"
    other.mkdir()
    (other / "model.keras").write_bytes(b"cnn weights")
    registry.publish(OTHER_MODEL, "20250105-x", other, run_id="manual__2025-01-05",
                     created="2025-01-05T00:00:00+00:00", metrics={"accuracy": 0.97})


# --------------------------------------------------------------------------- api-server


# Stands in for the promote_model DAG that the page triggers (no scheduler runs it here).
STAND_IN_DAG = ('from airflow.sdk import DAG, task\n\nwith DAG("promote_model", schedule=None):\n'
                '    task(lambda: None, task_id="record")()\n')


class ApiServer:
    """``airflow api-server`` alone on 127.0.0.1, in a fresh AIRFLOW_HOME (SQLite), with
    a ``viewer`` (USER) and a ``user`` (RELEASER), and a promote_model DAG to trigger."""

    def __init__(self, root: Path, store_uri: str, connection: dict[str, Any]):
        self.root = root
        self.home = root / "airflow-home"
        self.log = root / "api-server.log"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.passwords = {USER: secrets.token_urlsafe(16), RELEASER: secrets.token_urlsafe(16)}
        self.password = self.passwords[USER]
        self.proc: subprocess.Popen | None = None
        passwords = self.home / "simple_auth_manager_passwords.json"
        dags = root / "dags"  # the api-server does not parse DAGs: reserialized in start
        base = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
        self.env = {
            **base,
            "PATH": os.fspath(Path(sys.executable).parent) + os.pathsep + base.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
            "AIRFLOW_HOME": os.fspath(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": os.fspath(dags),
            "AIRFLOW__CORE__PLUGINS_FOLDER": os.fspath(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(64),
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:viewer,{RELEASER}:user",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": os.fspath(passwords),
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(connection),
            "TRAINING_STORE_URI": store_uri,
            "TRAINING_DATA_DIR": os.fspath(root / "training"),
        }
        self.home.mkdir(parents=True)
        dags.mkdir()
        (dags / "promote_model.py").write_text(STAND_IN_DAG)
        passwords.write_text(json.dumps(self.passwords) + "\n")

    def start(self) -> None:
        airflow = os.fspath(Path(sys.executable).with_name("airflow"))
        for command in (["db", "migrate"], ["dags", "reserialize"]):
            done = subprocess.run(
                [airflow, *command], env=self.env, cwd=self.root, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, timeout=300,
            )
            if done.returncode != 0:
                raise RuntimeError(f"airflow {' '.join(command)} failed:\n{done.stdout[-5000:]}")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [airflow, "api-server", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"api-server exited with {self.proc.returncode}\n"
                                   + self.log_tail())
            try:
                self.token()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"api-server not ready after {timeout:.0f} s\n"
                                   + self.log_tail())
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError as exc:
            return f"<cannot read {self.log}: {exc.strerror}>"
        return "----- api-server log (tail) -----\n" + "\n".join(text.splitlines()[-lines:])

    def token(self, user: str = USER) -> str:
        status, _, body = self.get("/auth/token", method="POST", data=json.dumps(
            {"username": user, "password": self.passwords[user]}).encode(),
            headers={"Content-Type": "application/json"})
        if status != 201:
            raise ConnectionError(f"POST /auth/token answered {status}: {body[:300]!r}")
        return json.loads(body)["access_token"]

    def get(self, path: str, *, method: str = "GET", data: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one request; redirects are returned, not followed."""

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers=headers or {})
        try:
            with opener.open(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()


_SITE: dict[str, ApiServer] = {}  # the session's one api-server, whichever module started it


@pytest.fixture(scope="session")
def models_site(s3_server, tmp_path_factory: pytest.TempPathFactory):
    """The filled store and a started api-server that shows it, one per session: shared
    with test_models_page_actions.py, which imports this fixture (pytest makes one per
    module that holds it; the first starts the server and stops it at the end)."""
    if "server" in _SITE:
        yield _SITE["server"]
        return
    root = tmp_path_factory.mktemp("models-page")
    bucket = s3_server.create_bucket()
    store_uri = f"s3://{bucket}/team"
    fill_store(ModelRegistry(open_store(store_uri, s3_server.options()), check_model=False),
               root / "published")
    # The team's keys, made up for this session's server, which refuses any others.
    server = ApiServer(root, store_uri, s3_server.connection())
    try:
        server.start()
        server.wait_ready()
        server.credentials = (  # type: ignore[attr-defined]
            s3_server.team.access_key, s3_server.team.secret_key)
        _SITE["server"] = server
        yield server
    finally:
        _SITE.pop("server", None)
        server.stop()


def assert_no_credential(server: Any, text: str | bytes, where: str) -> None:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    for value in server.credentials:
        assert value not in text, f"a credential of the connection appears in {where}"


# --------------------------------------------------------------------------- HTTP


def test_models_page_refuses_requests_without_login(models_site):
    server = models_site
    report = f"/models/{MODEL}/versions/{PRODUCTION}/report/index.html"
    image = f"/models/{MODEL}/versions/{PRODUCTION}/report/confusion_matrix.png"
    for path in ("/models/", report, image):
        status, headers, body = server.get(path, headers={"Accept": "application/json"})
        assert status == 401, (path, status, body[:300])
        assert MODEL.encode() not in body or path != "/models/", body[:300]
        status, _, _ = server.get(path, headers={"Authorization": "Bearer not-a-jwt"})
        assert status == 401, (path, status)
    # A browser navigation is sent to Airflow's login page, which comes back here.
    status, headers, _ = server.get("/models/", headers={"Accept": "text/html"})
    assert status == 303
    assert headers["location"].startswith("/auth/login?next="), headers
    assert "%2Fmodels%2F" in headers["location"], headers


def test_models_page_serves_versions_and_reports_read_only(models_site):
    server = models_site
    auth = {"Authorization": f"Bearer {server.token()}"}
    status, headers, body = server.get("/models/", headers=auth)
    assert status == 200, body[:500]
    assert headers["content-type"].startswith("text/html")
    assert "script-src" not in headers["content-security-policy"]  # default-src 'none'
    assert "default-src 'none'" in headers["content-security-policy"]
    page = body.decode()
    assert_no_credential(server, page, "the Models page")
    # Most recently published first (they were published in this order), by the order of
    # the version ids in the table's HTML.
    table = page.index('<table class="versions">', page.index(f'data-model="{MODEL}"'))
    positions = [page.index(f'data-version="{v}"', table) for v, *_ in VERSIONS]
    assert positions == sorted(positions, reverse=True), positions
    assert (f'class="version production" id="{MODEL}/{PRODUCTION}" '
            f'data-version="{PRODUCTION}"') in page
    assert "nothing in production" in page  # the other model
    assert page.count("no report") == 2  # 20250103-c and the other model's version

    prefix = f"/models/{MODEL}/versions/{PRODUCTION}/report/"
    status, headers, body = server.get(prefix + "index.html", headers=auth)
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert str(escape(DECISION)).encode() in body  # the report escapes what it shows
    status, headers, png = server.get(prefix + "confusion_matrix.png", headers=auth)
    assert status == 200 and headers["content-type"] == "image/png"
    assert png.startswith(b"\x89PNG\r\n")
    status, headers, _ = server.get(prefix, headers=auth)
    assert status == 307 and headers["location"] == "index.html"

    # Only report files the manifest lists; names, versions and paths are checked.
    refused = [
        prefix + "..%2Fmodel.keras",
        prefix + "%2e%2e/manifest.json",
        prefix + "missing.png",
        f"/models/{MODEL}/versions/20250103-c/report/index.html",  # published without one
        f"/models/{MODEL}/versions/no-such-version/report/index.html",
        f"/models/..%2F..%2Fetc/versions/{PRODUCTION}/report/index.html",
        f"/models/{MODEL}/versions/..%2F{PRODUCTION}/report/index.html",
    ]
    for path in refused:
        status, _, body = server.get(path, headers=auth)
        assert status == 404, (path, status, body[:300])
        assert_no_credential(server, body, f"the answer to {path}")
    for method in ("POST", "PUT", "DELETE"):
        status, _, _ = server.get("/models/", method=method, headers=auth)
        assert status == 405, (method, status)
    assert_no_credential(server, server.log.read_bytes(), "the api-server log")


def test_history_says_what_each_record_did(monkeypatch):
    monkeypatch.syspath_prepend(os.fspath(REPO / "plugins"))
    from models_view import page

    records = [  # oldest first, as the pointer keeps them; shown newest first
        {"from": None, "to": "v1", "reason": "first"},  # written before "action" existed
        {"from": "v1", "to": "v2", "action": "promoted", "forced": True, "by": "ann"},
        {"from": "v2", "to": "v2", "rejected": "v3", "action": "timed out", "reason": "nobody"},
        {"from": "v2", "to": "v1", "action": "rollback", "by": "bob", "reason": "rollback"},
    ]
    shown = page.render_index([{"name": "m", "production": "v1", "versions": [],
                                "history": records}], "/store")
    rows = re.findall(r'<tr data-action="([^"]+)"><td>[^<]*</td><td class="change">(.*?)</td>'
                      r'<td class="by">([^<]*)</td>', shown, re.S)
    assert rows == [
        ("rollback", "rollback: <code>v2</code> &rarr; <code>v1</code>", "bob"),
        ("timed out", "timed out <code>v3</code>", ""),
        ("promoted", "promoted: <code>v1</code> &rarr; <code>v2</code> (forced)", "ann"),
        ("promoted", 'promoted: <span class="none">none</span> &rarr; <code>v1</code>', ""),
    ]
