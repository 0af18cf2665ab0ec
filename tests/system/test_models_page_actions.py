"""System: the Models page's plot, compare page, promote form and history, on the site
of ``test_models_page.py`` (its ``models_site``, one per session). The promote form
triggers the stand-in ``promote_model`` DAG through the api-server's own REST API as the
caller: Airflow refuses a ``viewer`` and records a ``user``'s run with its conf. In
process: nothing from the store reaches the page unescaped or unscrubbed. In chromium:
the page in the UI's frame, a report, the compare form and the roll-back form;
screenshots go to ``$TEST_ARTIFACTS_DIR`` (default ``artifacts/``) too.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode, urljoin

import pytest
import test_models_page
from support.fresh import artifacts_dir
from test_models_page import (
    DATASETS,
    DECISION,
    EPOCHS,
    HOLDOUT,
    MODEL,
    OTHER_MODEL,
    PRODUCTION,
    REJECTION,
    RELEASER,
    REPO,
    REVIEWER,
    USER,
    VERSIONS,
    assert_no_credential,
)

pytestmark = pytest.mark.slow
models_site = test_models_page.models_site  # the session's site, shared with that module

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SVG = "{http://www.w3.org/2000/svg}"
OLDEST, NEWEST = VERSIONS[0][0], VERSIONS[-1][0]
RUNS = "/api/v2/dags/promote_model/dagRuns"


def bearer(server: Any, user: str = USER) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token(user)}"}


def models_page(server: Any) -> str:
    status, _, body = server.get("/models/", headers=bearer(server))
    assert status == 200, body[:500]
    return body.decode()


def plot_of(page: str, model: str) -> ET.Element:
    found = re.search(rf'<svg class="accuracy-plot" data-model="{model}".*?</svg>', page, re.S)
    assert found, f"no accuracy plot for {model}"
    return ET.fromstring(found.group(0))


def row_of(page: str, version: str) -> str:
    found = re.search(rf'<tr class="version[^"]*" id="[^"]+/{version}" data-version="{version}">'
                      r".*?</tr>", page, re.S)
    assert found, f"no row for {version}"
    return found.group(0)


def form_fields(html: str) -> tuple[dict[str, str], set[str]]:
    """The page's named inputs (name -> value) and the names of the required ones."""
    tags = [dict(re.findall(r'([\w-]+)(?:="([^"]*)")?', attributes))
            for attributes in re.findall(r"<(?:input|textarea)\b([^>]*)>", html)]
    return ({t["name"]: t.get("value", "") for t in tags if "name" in t},
            {t["name"] for t in tags if "required" in t})


def post_form(server: Any, path: str, fields: dict[str, str], headers: dict[str, str]
              ) -> tuple[int, dict[str, str], str]:
    status, answer_headers, body = server.get(
        path, method="POST", data=urlencode(fields).encode(),
        headers={**headers, "Content-Type": "application/x-www-form-urlencoded"})
    return status, answer_headers, body.decode(errors="replace")


def run_count(server: Any) -> int:
    status, _, body = server.get(RUNS, headers=bearer(server, RELEASER))
    assert status == 200, body[:300]
    return json.loads(body)["total_entries"]


# --------------------------------------------------------------------------- HTTP


def test_plot_shows_each_version_in_publish_order_with_production_marked(models_site):
    page = models_page(models_site)
    svg = plot_of(page, MODEL)
    points = [c for c in svg.iter(f"{SVG}circle") if "point" in c.get("class", "").split()]
    assert [p.get("data-version") for p in points] == [v for v, *_ in VERSIONS]
    assert [float(p.get("data-value")) for p in points] == [
        metrics["accuracy"] for _, _, metrics, _ in VERSIONS]
    xs = [float(p.get("cx")) for p in points]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)  # publish order, left to right
    by_height = sorted(points, key=lambda p: float(p.get("cy")))  # SVG y grows downwards
    assert by_height == sorted(points, key=lambda p: -float(p.get("data-value")))
    marked = [p.get("data-version") for p in points if "production" in p.get("class").split()]
    assert marked == [PRODUCTION]
    ring = svg.find(f'{SVG}circle[@class="production-mark"][@data-version="{PRODUCTION}"]')
    point = svg.find(f'{SVG}circle[@data-version="{PRODUCTION}"]')  # the ring is around it
    assert (ring.get("cx"), ring.get("cy")) == (point.get("cx"), point.get("cy"))
    assert [r.get("data-version") for r in svg.iter(f"{SVG}rect") if r.get("data-series")
            == "holdout"] == [v for v, *_ in VERSIONS if HOLDOUT[v] is not None]
    texts = {t.text for t in svg.iter(f"{SVG}text")}
    assert {"accuracy", "test accuracy", "holdout accuracy", "in production"} <= texts
    assert {created[:10] for _, created, *_ in VERSIONS} <= texts  # the x axis' labels

    other = plot_of(page, OTHER_MODEL)  # one version, nothing in production
    assert len([c for c in other.iter(f"{SVG}circle") if "point" in c.get("class", "")]) == 1
    assert not [c for c in other.iter(f"{SVG}circle") if c.get("class") == "production-mark"]


def test_rows_show_dataset_and_actions_and_history_says_who_and_what(models_site):
    page = models_page(models_site)
    for version, *_ in VERSIONS:
        dataset = f'<td class="dataset"><code>{DATASETS[version]}</code></td>'
        assert dataset in row_of(page, version).replace("<wbr>", "")  # may break at "@"
    base = f'href="{MODEL}/versions/{{}}/promote?action={{}}"'
    assert base.format(NEWEST, "promote") + ">promote this version</a>" in row_of(page, NEWEST)
    assert base.format(OLDEST, "rollback") + ">roll back to this version</a>" in row_of(page,
                                                                                       OLDEST)
    assert "/promote?" not in row_of(page, PRODUCTION)
    assert "promote this version" in row_of(page, "20250105-x")  # nothing in production

    start = page.index(f'<section class="model" id="model-{MODEL}"')
    section = page[start:page.index("</section>", start)]
    history = re.findall(r'<tr data-action="([^"]+)">(.*?)</tr>', section, re.S)
    assert [action for action, _ in history] == ["rejected", "promoted", "promoted"]
    rejected, promoted, first = (cells for _, cells in history)
    assert f"rejected <code>{NEWEST}</code>" in rejected and REJECTION in rejected
    assert f'<td class="by">{REVIEWER}</td>' in rejected
    assert f"<code>{OLDEST}</code> &rarr; <code>{PRODUCTION}</code>" in promoted
    assert f'<td class="by">{RELEASER}</td>' in promoted
    assert '<td class="by"></td>' in first and "first version" in first


def test_compare_shows_two_versions_settings_side_by_side(models_site):
    server, auth = models_site, bearer(models_site)
    status, headers, body = server.get(
        f"/models/{MODEL}/compare?a={OLDEST}&b={PRODUCTION}", headers=auth)
    page = body.decode()
    assert status == 200, page[:500]
    assert "form-action 'none'" in headers["content-security-policy"]  # it holds no form
    rows = {setting: kind for kind, setting in
            re.findall(r'<tr class="(differs|same)" data-setting="([^"]+)">', page)}
    assert rows == {"model.name": "same", "model.args": "same", "fit.epochs": "differs",
                    "fit.batch_size": "same", "fit.learning_rate": "same",
                    "storage.model_name": "same"}
    epochs = re.search(r'data-setting="fit.epochs">(.*?)</tr>', page, re.S).group(1)
    assert re.findall(r"<code>(\d+)</code>", epochs) == [str(EPOCHS[OLDEST]),
                                                         str(EPOCHS[PRODUCTION])]
    assert "1 differs (highlighted)" in page

    status, _, body = server.get(f"/models/{MODEL}/compare?a={NEWEST}&b={NEWEST}", headers=auth)
    assert status == 200 and b'class="differs"' not in body
    refused = {
        f"/models/{MODEL}/compare?a={OLDEST}": (400, "b is missing"),
        f"/models/{MODEL}/compare?b={OLDEST}": (400, "a is missing"),
        f"/models/{MODEL}/compare?a={OLDEST}&b=no-such": (404, "b=&#39;no-such&#39; is not"),
        f"/models/{MODEL}/compare?a=..%2Fx&b={OLDEST}": (404, "a=&#39;../x&#39; is not"),
        f"/models/no-such-model/compare?a={OLDEST}&b={OLDEST}": (404, "no published version"),
    }
    for path, (expected, words) in refused.items():
        status, _, body = server.get(path, headers=auth)
        text = body.decode()
        assert status == expected and words in text, (path, status, text[-400:])
        if "is missing" in words or "is not" in words:  # says what is allowed
            assert ", ".join(v for v, *_ in reversed(VERSIONS)) in text, text[-400:]


def test_promote_form_is_prefilled_guarded_and_triggers_the_dag_as_the_caller(models_site):
    server = models_site
    viewer, releaser = bearer(server), bearer(server, RELEASER)
    form_path = f"/models/{MODEL}/versions/{NEWEST}/promote"
    status, headers, body = server.get(form_path + "?action=promote", headers=viewer)
    assert status == 200, body[:500]
    assert "form-action 'self'" in headers["content-security-policy"]
    form, required = form_fields(body.decode())
    assert {k: form[k] for k in ("model", "version", "action", "reason")} == {
        "model": MODEL, "version": NEWEST, "action": "promote", "reason": ""}
    assert required == {"reason"} and len(form["token"]) == 64
    for path, (expected, words) in {
        form_path + "?action=deploy": (400, "action must be &#39;promote&#39; or &#39;rollback"),
        f"/models/{MODEL}/versions/no-such/promote?action=promote": (404, "no complete version"),
        f"/models/{MODEL}/versions/{PRODUCTION}/promote?action=rollback":
            (400, "already in production"),
    }.items():
        status, _, body = server.get(path, headers=viewer)
        assert status == expected and words in body.decode(), (path, status, body[-300:])

    before = run_count(server)
    good = {**form, "reason": "holdout accuracy is back up"}
    status, _, _ = post_form(server, form_path, good, {})  # not logged in
    assert status == 401
    for token in ("", "0" * 64, form["token"][:-1] + "x"):
        status, _, text = post_form(server, form_path, {**good, "token": token}, viewer)
        assert status == 403 and "the form&#39;s token is missing or wrong" in text, text[-300:]
    # The token is the viewer's: another user cannot send it, nor change the action with it.
    status, _, _ = post_form(server, form_path, good, releaser)
    assert status == 403
    status, _, _ = post_form(server, form_path, {**good, "action": "rollback"}, viewer)
    assert status == 403
    status, _, text = post_form(server, form_path, {**good, "reason": "  "}, viewer)
    assert status == 400 and "reason is required" in text, text[-500:]
    assert form_fields(text)[0]["version"] == NEWEST  # the form again, still filled
    # A viewer may see the page, but Airflow does not let them trigger the DAG.
    status, _, text = post_form(server, form_path, good, viewer)
    assert status == 403 and "you may not trigger promote_model" in text, text[-500:]
    assert run_count(server) == before

    status, _, body = server.get(form_path + "?action=promote", headers=releaser)
    token = form_fields(body.decode())[0]["token"]
    status, headers, text = post_form(server, form_path, {**good, "token": token}, releaser)
    assert status == 303, text[-500:]
    location = urljoin(server.base_url + form_path, headers["location"])
    prefix = f"{server.base_url}/dags/promote_model/runs/"
    assert location.startswith(prefix), location
    run_id = unquote(location[len(prefix):])
    status, _, body = server.get(f"{RUNS}/{quote(run_id, safe='')}", headers=releaser)
    assert status == 200, body[:300]
    run = json.loads(body)
    assert run["conf"] == {"model_name": MODEL, "version": NEWEST, "action": "promote",
                           "reason": "holdout accuracy is back up"}
    assert run["triggering_user_name"] == RELEASER
    assert run_count(server) == before + 1
    assert_no_credential(server, server.log.read_bytes(), "the api-server log")


# --------------------------------------------------------------------------- in process


def test_store_errors_are_scrubbed_and_run_values_escaped(monkeypatch):
    """What the store or a run wrote never reaches the page unescaped, and a store error
    is shown without the connection's secrets."""
    import asyncio

    import httpx

    from training.errors import StorageError

    monkeypatch.syspath_prepend(os.fspath(REPO / "plugins"))
    from models_view import page
    from models_view.parts import stores

    secret = "secret-" + secrets.token_urlsafe(16)

    class BrokenStore:
        secrets = frozenset({secret})

        def get(self) -> Any:
            raise StorageError(f"cannot list 'models/' in s3://b: SignatureDoesNotMatch "
                               f"(signed with {secret})")

    monkeypatch.setattr(stores, "STORES", BrokenStore())
    app = page.create_app()
    app.dependency_overrides[page.require_viewer] = lambda: "tester"

    async def get(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get(path)

    for path in ("/", "/m/compare?a=v1&b=v2", "/m/versions/v1/promote?action=promote"):
        answer = asyncio.run(get(path))
        assert answer.status_code == 502, answer.text
        assert "SignatureDoesNotMatch" in answer.text and "***" in answer.text
        assert secret not in answer.text

    hostile = "<img src=x onerror=alert(1)>"
    shown = page.render_index([{
        "name": "m", "production": "v1",
        "versions": [{"version": "v1", "created": hostile, "run_id": hostile,
                      "source": {"dag_id": hostile, "run_id": hostile}, "dataset": hostile,
                      "metrics": {"accuracy": hostile, "loss": 0.5}, "has_report": True}],
        "history": [{"from": None, "to": "v1", "at": hostile, "reason": hostile,
                     "run_id": hostile, "forced": True, "by": hostile}],
    }], "s3://user:password@bucket/prefix")
    # published (= created here), created, accuracy, dataset, the Airflow run; at, by,
    # reason, run id
    assert "<img" not in shown and shown.count("&lt;img src=x") == 9
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
            expect(model.locator("table.history tbody tr")).to_have_count(3)
            expect(frame.locator(f'section[data-model="{OTHER_MODEL}"]')).to_contain_text(
                "nothing in production")
            plot = model.locator("svg.accuracy-plot")  # drawn under the page's CSP
            expect(plot).to_be_visible()
            assert plot.bounding_box()["width"] > 300
            expect(plot.locator("circle.point.production")).to_have_count(1)
            page.screenshot(path=shots / "models-page.png")
            model.screenshot(path=shots / "models-page-model.png")  # its plot, rows, history
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
            page.set_viewport_size({"width": 1400, "height": 900})

            # The compare form (a GET form: the page's CSP lets it be sent here).
            page.goto(f"{server.base_url}/plugin/models")
            model.get_by_role("button", name="compare").click()
            expect(frame.locator("h1")).to_contain_text(f"settings of {PRODUCTION} and {NEWEST}")
            expect(frame.locator("table.compare tr.differs")).to_have_count(1)  # fit.epochs
            expect(frame.locator("table.compare tbody tr")).to_have_count(6)

            # "roll back to this version" on an older row: the prefilled form.
            page.goto(f"{server.base_url}/plugin/models")
            model.locator(f'tr[data-version="{OLDEST}"]').get_by_role(
                "link", name="roll back to this version").click()
            expect(frame.locator("h1")).to_contain_text(f"Roll back {MODEL} to version {OLDEST}")
            assert frame.locator("form.promote").evaluate(
                "f => Object.fromEntries([...new FormData(f)].filter(([k]) => k != 'token'))"
            ) == {"model": MODEL, "version": OLDEST, "action": "rollback", "reason": ""}
            expect(frame.locator("#reason")).to_have_attribute("required", "")
            page.screenshot(path=shots / "promote-form.png")
            # A viewer sends it: Airflow refuses to trigger the DAG for them.
            frame.locator("#reason").fill("the newer version misclassifies sevens")
            frame.get_by_role("button", name="roll back").click()
            expect(frame.locator("h1")).to_have_text("Forbidden")
            expect(frame.locator("p")).to_contain_text("you may not trigger promote_model")
            page.screenshot(path=shots / "promote-refused.png")
        finally:
            context.close()
    saved = artifacts_dir()
    for shot in shots.iterdir():
        shutil.copy2(shot, saved / shot.name)
