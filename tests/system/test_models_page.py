"""System: the Models page plugin in a real Airflow api-server, driven by a real browser.

A store on the session's S3 server (SeaweedFS over HTTP) is filled first: two models, one
with three versions (two with a report, two promotions), one never promoted. Then an
``airflow api-server`` on a free 127.0.0.1 port loads the project's ``plugins/`` with
the SimpleAuthManager, one ``viewer`` user, ``TRAINING_STORE_URI`` on that store and an
``aws_default`` connection whose keys are made up for the session's S3 server, which
checks every signature. No AWS_* variable reaches the api-server: the page can only read
the store with the connection's keys.

Debian's chromium, driven by Playwright, logs in through Airflow's login form, opens
the page from the UI's navigation, checks the versions, the production mark and the
history, and opens a report. Screenshots go to pytest's tmp dir and to
``$TEST_ARTIFACTS_DIR`` (default ``artifacts/`` at the repository root).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
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
from support.fresh import artifacts_dir
from support.s3server import free_port

from training.registry import open_store
from training.registry.versions import ModelRegistry

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
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
_FOREIGN_PREFIXES = ("AIRFLOW_", "AIRFLOW__", "TRAINING_", "AWS_", "_AIRFLOW")


# --------------------------------------------------------------------------- the store


def write_report(directory: Path, version: str, metrics: dict[str, float],
                 champion: dict[str, Any] | None, reason: str) -> None:
    """The version's report, built by ``training.report`` from small training records."""
    from training.report import build_report

    epochs = 6
    history = {
        "epochs": list(range(1, epochs + 1)),
        "metrics": {
            "loss": [1.2 / (e + 1) for e in range(epochs)],
            "accuracy": [0.6 + 0.06 * e for e in range(epochs)],
            "val_loss": [1.3 / (e + 1) for e in range(epochs)],
            "val_accuracy": [0.58 + 0.06 * e for e in range(epochs)],
            "learning_rate": [1e-3] * 4 + [5e-4] * 2,
        },
        "lr_reduced_at_epochs": [5],
        "early_stopping": {"monitor": "val_loss", "stopped_epoch": None, "best_epoch": 6,
                           "best_value": 0.2167, "restored_best_weights": True},
    }
    evaluation = {
        "model_name": MODEL,
        "version": version,
        "dataset": "digits:1.0.0@b504be350b053dde",
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
    for name, record in (("history.json", history), ("evaluation.json", evaluation)):
        (directory / name).write_text(json.dumps(record))
    build_report(directory)


def fill_store(registry: ModelRegistry, work: Path) -> None:
    champion = None
    for version, created, metrics, with_report in VERSIONS:
        directory = work / version
        directory.mkdir(parents=True)
        (directory / "model.keras").write_bytes(f"weights of {version}".encode())
        (directory / "config.json").write_text(json.dumps({"version": version}))
        if with_report:
            reason = DECISION if version == PRODUCTION else "no model in production"
            write_report(directory, version, metrics, champion, reason)
            champion = champion or {"version": version, **metrics}
        registry.publish(MODEL, version, directory, run_id=f"manual__{created}",
                         created=created, metrics=metrics)
    registry.promote(MODEL, "20250101-a", run_id="manual__2025-01-01T00:00:00+00:00",
                     at="2025-01-01T00:10:00+00:00", reason="first version")
    registry.promote(MODEL, PRODUCTION, run_id="manual__2025-01-02T00:00:00+00:00",
                     at="2025-01-02T00:10:00+00:00",
                     reason="accuracy 0.9512 beats 0.9134 by 0.0378 >= 0.005")
    other = work / "other"
    other.mkdir()
    (other / "model.keras").write_bytes(b"cnn weights")
    registry.publish(OTHER_MODEL, "20250105-x", other, run_id="manual__2025-01-05",
                     created="2025-01-05T00:00:00+00:00", metrics={"accuracy": 0.97})


# --------------------------------------------------------------------------- api-server


class ApiServer:
    """``airflow api-server`` alone on 127.0.0.1, in a fresh AIRFLOW_HOME (SQLite)."""

    def __init__(self, root: Path, store_uri: str, connection: dict[str, Any]):
        self.root = root
        self.home = root / "airflow-home"
        self.log = root / "api-server.log"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.password = secrets.token_urlsafe(16)
        self.proc: subprocess.Popen | None = None
        passwords = self.home / "simple_auth_manager_passwords.json"
        dags = root / "dags"  # the api-server does not parse DAGs: an empty folder
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
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": os.fspath(passwords),
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(connection),
            "TRAINING_STORE_URI": store_uri,
            "TRAINING_DATA_DIR": os.fspath(root / "training"),
        }
        self.home.mkdir(parents=True)
        dags.mkdir()
        passwords.write_text(json.dumps({USER: self.password}) + "\n")

    def start(self) -> None:
        airflow = os.fspath(Path(sys.executable).with_name("airflow"))
        migrate = subprocess.run(
            [airflow, "db", "migrate"], env=self.env, cwd=self.root, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=300,
        )
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stdout[-5000:]}")
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

    def token(self) -> str:
        status, _, body = self.get("/auth/token", method="POST", data=json.dumps(
            {"username": USER, "password": self.password}).encode(),
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


@pytest.fixture(scope="module")
def models_site(s3_server, tmp_path_factory: pytest.TempPathFactory):
    """The filled store and a started api-server that shows it."""
    root = tmp_path_factory.mktemp("models-page")
    bucket = s3_server.create_bucket()
    store_uri = f"s3://{bucket}/team"
    fill_store(ModelRegistry(open_store(store_uri, s3_server.options()), check_model=False),
               root / "published")
    # The team's keys, made up for this session's server, which refuses any others.
    connection = s3_server.connection()
    server = ApiServer(root, store_uri, connection)
    try:
        server.start()
        server.wait_ready()
        server.credentials = (  # type: ignore[attr-defined]
            s3_server.team.access_key, s3_server.team.secret_key)
        yield server
    finally:
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
    # the version ids in the HTML.
    positions = [page.index(f'data-version="{v}"') for v, *_ in VERSIONS]
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


def test_store_errors_are_scrubbed_and_run_values_escaped(monkeypatch):
    """In process: what the store or a run wrote never reaches the page unescaped, and a
    store error is shown without the connection's secrets."""
    import asyncio

    import httpx

    from training.errors import StorageError

    monkeypatch.syspath_prepend(os.fspath(REPO / "plugins"))
    from models_view import page

    secret = "secret-" + secrets.token_urlsafe(16)

    class BrokenStore:
        secrets = frozenset({secret})

        def get(self) -> Any:
            raise StorageError(f"cannot list 'models/' in s3://b: SignatureDoesNotMatch "
                               f"(signed with {secret})")

    monkeypatch.setattr(page, "_stores", BrokenStore())
    app = page.create_app()
    app.dependency_overrides[page.require_viewer] = lambda: "tester"

    async def get_index() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/")

    answer = asyncio.run(get_index())
    assert answer.status_code == 502, answer.text
    assert "SignatureDoesNotMatch" in answer.text and "***" in answer.text
    assert secret not in answer.text

    hostile = "<img src=x onerror=alert(1)>"
    shown = page.render_index([{
        "name": "m", "production": "v1",
        "versions": [{"version": "v1", "created": hostile, "run_id": hostile,
                      "source": {"dag_id": hostile, "run_id": hostile},
                      "metrics": {"accuracy": hostile, "loss": 0.5}, "has_report": True}],
        "history": [{"from": None, "to": "v1", "at": hostile, "reason": hostile,
                     "run_id": hostile, "forced": True}],
    }], "s3://user:password@bucket/prefix")
    # published (= created here), created, accuracy, the Airflow run; at, reason, run id
    assert "<img" not in shown and shown.count("&lt;img src=x") == 7
    assert 'href="../dags/%3Cimg%20src%3Dx' in shown  # the run link is quoted too
    assert "password" not in shown and "s3://bucket/prefix" in shown
    assert 'href="m/versions/v1/report/index.html"' in shown


# --------------------------------------------------------------------------- browser


def test_models_page_in_a_real_browser(models_site, tmp_path: Path):
    from playwright.sync_api import expect, sync_playwright

    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no chromium at {CHROMIUM}: install Debian's (apt-get install -y chromium) "
                    "or point CHROMIUM_PATH at one")
    server = models_site
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            os.fspath(tmp_path / "chromium-profile"), executable_path=CHROMIUM,
            args=CHROMIUM_ARGS, headless=True, viewport={"width": 1400, "height": 900},
        )
        try:
            context.set_default_timeout(30_000)
            page = context.new_page()
            # Not logged in: the page sends the browser to Airflow's login form.
            page.goto(f"{server.base_url}/models/")
            expect(page).to_have_url(re.compile(re.escape(f"{server.base_url}/auth/login?next=")))
            page.get_by_label("Username").fill(USER)
            page.get_by_label("Password").fill(server.password)
            page.get_by_role("button", name="Sign in").click()
            # Airflow's UI, then its navigation entry for the plugin's page.
            page.wait_for_url(f"{server.base_url}/models/")
            page.goto(f"{server.base_url}/")
            page.get_by_role("link", name="Models").click()
            page.wait_for_url(f"{server.base_url}/plugin/models")
            frame = page.frame_locator("iframe")
            model = frame.locator(f'section[data-model="{MODEL}"]')
            rows = model.locator("table.versions tbody tr")
            expect(rows).to_have_count(3)
            assert rows.evaluate_all("rs => rs.map(r => r.dataset.version)") == [
                v for v, *_ in reversed(VERSIONS)
            ]
            production = model.locator("tr.production")
            expect(production).to_have_count(1)
            expect(production).to_have_attribute("data-version", PRODUCTION)
            expect(production.locator(".badge")).to_have_text("production")
            expect(model.locator("p.production")).to_contain_text(f"in production: {PRODUCTION}")
            expect(model.locator("table.history tbody tr")).to_have_count(2)
            expect(frame.locator(f'section[data-model="{OTHER_MODEL}"]')).to_contain_text(
                "nothing in production")
            page.screenshot(path=shots / "models-page.png")
            shown = page.frame_locator("iframe").locator("html").inner_html()
            assert_no_credential(server, shown, "the page in the browser")

            production.get_by_role("link", name="report").click()
            report = page.frame_locator("iframe")
            expect(report.locator("h1")).to_have_text(f"{MODEL} version {PRODUCTION}")
            expect(report.locator(".verdict")).to_have_text("promote to production")
            expect(report.locator("ul.reasons")).to_contain_text(DECISION)
            images = report.locator("img")
            expect(images).to_have_count(2)  # learning curves, confusion matrix
            for i in range(2):
                images.nth(i).evaluate("img => img.decode()")
                assert images.nth(i).evaluate("img => img.naturalWidth") > 0
            page.set_viewport_size({"width": 1400, "height": 1300})
            page.screenshot(path=shots / "report.png")
        finally:
            context.close()
    saved = artifacts_dir()
    for shot in shots.iterdir():
        shutil.copy2(shot, saved / shot.name)
