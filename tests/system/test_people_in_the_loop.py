"""System: people in the loop, on ``./dev airflow`` in headless Chromium.

The stack (``conftest.py``) sends alerts to an SMTP server and a webhook receiver on
127.0.0.1 and gives ``keras_retrain`` runs a deadline of one minute. Runs that require
approval are started over REST (the trigger form has its own journey); what a person
does is done in the browser:

1. a winning run waits in the Required actions view; its request (screenshot) shows the
   decision's reasons and links; Approve with a reason promotes, the history names the
   reviewer; one "promoted" alert;
2. a second winning run is left waiting past its deadline (one "late" alert), then
   rejected with a reason: nothing moves, ``promote`` is skipped, the Models page shows
   the rejection, its reviewer and reason; one "rejected" alert;
3. a third is never answered: after ``approval_timeout_minutes`` it is recorded as timed
   out, nothing moves; one "timed out" alert;
4. a run whose first task fails sends one failure alert whose log link opens the log;
5. the Models page's "promote this version" link opens the promote form filled in for
   that version; submitting it runs ``promote_model``, which moves the pointer and
   records the user; a version whose files were corrupted is refused in one line and
   the pointer stays;
6. (second test) the demo's days as a team's own images: two normal days train
   production, the drifted third day is refused by ``validate_data`` and one alert names
   every reason.

Screenshots: ``$TEST_ARTIFACTS_DIR/journey-people-*.png``.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any
from urllib.parse import quote, unquote

import pytest
from support.airflow_ui import log_in, shot
from support.devstack import DAG_ID
from support.receivers import mails

from training.registry import open_store
from training.registry.versions import ModelRegistry

pytestmark = pytest.mark.slow

MODEL = "people-digits"
CONF = {"model_name": MODEL, "epochs": 2, "min_accuracy": 0.5, "require_approval": True}
# The same data and training settings as production: validate_data would skip the run.
AGAIN = {**CONF, "force_train": True, "min_improvement": -1.0}


def _trigger(stack: Any, dag_id: str, conf: dict) -> str:
    stack.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    run = stack.request("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                        {"logical_date": None, "conf": conf})
    return run["dag_run_id"]


def _wait_for_task(stack: Any, run_id: str, task_id: str, states: set[str],
                   timeout: float = 420.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        state = stack.task_states(run_id).get(task_id)
        if state in states:
            return state
        if state in ("failed", "upstream_failed", "skipped", "removed"):
            break
        time.sleep(2.0)
    pytest.fail(f"{task_id} of {run_id} is {state}, not {states}\n{stack.diagnostics(run_id)}")


def _webhook_kinds(webhook: Any, run_id: str) -> Counter:
    return Counter(r["json"]["kind"] for r in webhook.requests
                   if r["json"]["run_id"] == run_id)


def _wait_for_alert(webhook: Any, run_id: str, kind: str, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r["json"] for r in webhook.requests
                 if r["json"]["run_id"] == run_id and r["json"]["kind"] == kind]
        if found:
            return found[0]
        time.sleep(2.0)
    pytest.fail(f"no {kind} alert for {run_id} in {timeout:.0f} s: "
                f"{[r['json']['subject'] for r in webhook.requests]}")


def _mailed(smtp: Any, subject_part: str) -> int:
    return sum(subject_part in str(message["Subject"]) for _, _, message in mails(smtp))


def _answer(page: Any, stack: Any, run_id: str, option: str, reason: str, name: str) -> None:
    """Open the run's request in Required actions, read it, answer it."""
    from playwright.sync_api import expect

    page.goto(f"{stack.base_url}/dags/{DAG_ID}/runs/{quote(run_id)}/tasks/"
              "approve_promotion/required_actions")
    expect(page.get_by_text(re.compile(rf"Promote {MODEL} .* to production\?")).first
           ).to_be_visible()
    expect(page.get_by_role("link", name="report")).to_be_visible()
    expect(page.get_by_role("link", name="models page")).to_be_visible()
    shot(page, f"people-{name}-request")
    page.locator("#element_reason").fill(reason)  # the form field of the "reason" param
    page.get_by_role("button", name=option, exact=True).click()
    _wait_for_task(stack, run_id, "approve_promotion", {"success"})
    page.reload()
    expect(page.get_by_text(re.compile(r"Response received at .* from admin"))).to_be_visible()
    shot(page, f"people-{name}-answered")


def test_approval_rejection_timeout_and_alerts(dev_airflow: Any, browser: Any,
                                               alert_receivers: Any):
    from playwright.sync_api import expect

    stack, (smtp, webhook) = dev_airflow, alert_receivers
    registry = ModelRegistry(open_store(stack.store_uri))
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(30_000)
    log_in(page, stack)

    # 1. Approved: promoted, the reviewer in the history, one alert.
    first = _trigger(stack, DAG_ID, CONF)
    _wait_for_task(stack, first, "approve_promotion", {"awaiting_input"})
    version_a = stack.xcom(first, "publish")["version"]
    assert registry.production(MODEL) is None  # nothing moves while it waits
    _answer(page, stack, first, "Approve", "the report looks right", "approve")
    assert stack.wait_for_run(first)["state"] == "success", stack.diagnostics(first)
    assert registry.production(MODEL) == version_a
    record = registry.history(MODEL)[-1]
    assert (record["action"], record["by"]) == ("promoted", "admin"), record
    assert "approved by admin: the report looks right" in record["reason"]
    assert _wait_for_alert(webhook, first, "promoted")["links"]["report"].startswith(
        stack.base_url)

    # 2. Left waiting past the deadline, then rejected: nothing moves.
    second = _trigger(stack, DAG_ID, AGAIN)
    _wait_for_task(stack, second, "approve_promotion", {"awaiting_input"})
    late = _wait_for_alert(webhook, second, "deadline_missed", timeout=300.0)
    assert "not finished by its deadline" in late["subject"]
    version_b = stack.xcom(second, "publish")["version"]
    _answer(page, stack, second, "Reject", "the confusion matrix looks wrong", "reject")
    assert stack.wait_for_run(second)["state"] == "success", stack.diagnostics(second)
    assert stack.task_states(second)["promote"] == "skipped"
    assert registry.production(MODEL) == version_a
    record = registry.history(MODEL)[-1]
    assert (record["action"], record["rejected"], record["by"], record["reason"]) == (
        "rejected", version_b, "admin", "the confusion matrix looks wrong")
    _wait_for_alert(webhook, second, "rejected")
    page.goto(f"{stack.base_url}/models/")
    expect(page.get_by_text("the confusion matrix looks wrong").first).to_be_visible()
    shot(page, "people-models-page-rejection")

    # 3. Never answered: timed out, nothing moves.
    third = _trigger(stack, DAG_ID, {**AGAIN, "approval_timeout_minutes": 1})
    assert stack.wait_for_run(third, timeout=600.0)["state"] == "success", \
        stack.diagnostics(third)
    assert stack.task_states(third)["promote"] == "skipped"
    assert registry.production(MODEL) == version_a
    record = registry.history(MODEL)[-1]
    assert (record["action"], record.get("by")) == ("timed out", None), record
    _wait_for_alert(webhook, third, "approval_timed_out")

    # 4. A failed first task: one alert, its log link opens the log.
    broken = _trigger(stack, DAG_ID, {"epoch": 3})
    assert _ended(stack, DAG_ID, broken)["state"] == "failed"
    failed = _wait_for_alert(webhook, broken, "task_failed")
    assert "unknown conf key 'epoch'" in " ".join(failed["lines"]), failed
    page.goto(failed["links"]["log"])
    expect(page.get_by_text("stage_dataset").first).to_be_visible()
    shot(page, "people-failure-log-link")

    # Each alert once (a run that also outlived the deadline adds its "late" alert).
    for run_id, kinds in ((first, {"promoted": 1}), (third, {"approval_timed_out": 1}),
                          (second, {"deadline_missed": 1, "rejected": 1}),
                          (broken, {"task_failed": 1})):
        counted = _webhook_kinds(webhook, run_id)
        assert {k: counted[k] for k in kinds} == kinds, counted
    assert _mailed(smtp, f"{MODEL} {version_b}") >= 1
    assert _mailed(smtp, "rejected") == 1

    # 5. From the Models page: a corrupted version is refused, another promoted, the
    # first rolled back to; each through promote_model, as the logged-in user.
    corrupted = registry.store.root / "models" / MODEL / "versions" / version_b / "model.keras"
    data = bytearray(corrupted.read_bytes())
    data[len(data) // 2] ^= 0x01
    corrupted.write_bytes(bytes(data))
    refused = _promote_from_the_models_page(page, stack, version_b, "promote",
                                            "rejected in error", "corrupt")
    assert refused["state"] == "failed"
    log = "\n".join(p.read_text() for p in
                    (stack.home / "logs" / "dag_id=promote_model").glob(
                        f"run_id={refused['dag_run_id']}/**/*.log"))
    assert f"refusing to promote model '{MODEL}' version '{version_b}'" in log
    assert registry.production(MODEL) == version_a
    version_c = stack.xcom(third, "publish")["version"]
    moved = _promote_from_the_models_page(page, stack, version_c, "promote",
                                          "reviewed the timed-out one", "promote")
    assert moved["state"] == "success" and registry.production(MODEL) == version_c
    back = _promote_from_the_models_page(page, stack, version_a, "rollback",
                                         "the new one misbehaves", "rollback")
    assert back["state"] == "success" and registry.production(MODEL) == version_a
    assert [(r["action"], r["to"], r["by"]) for r in registry.history(MODEL)[-2:]] == [
        ("promoted", version_c, "admin"), ("rollback", version_a, "admin")]
    page.goto(f"{stack.base_url}/models/")
    expect(page.get_by_text("the new one misbehaves").first).to_be_visible()
    shot(page, "people-models-page-after")


def _promote_from_the_models_page(page: Any, stack: Any, version: str, action: str,
                                  reason: str, name: str) -> dict:
    """Follow the version's row link, fill the reason, send; the promote_model run."""
    from playwright.sync_api import expect

    page.goto(f"{stack.base_url}/models/")
    row = page.locator(f'tr[data-version="{version}"]')
    link = "promote this version" if action == "promote" else "roll back to this version"
    row.get_by_role("link", name=link).click()
    expect(page.locator("#version")).to_have_value(version)
    expect(page.locator("#action")).to_have_value(action)
    page.locator("#reason").fill(reason)
    shot(page, f"people-form-{name}")
    page.get_by_role("button", name="promote" if action == "promote" else "roll back").click()
    expect(page).to_have_url(re.compile(r"/dags/promote_model/runs/"))
    run_id = page.url.split("/dags/promote_model/runs/", 1)[1].split("?")[0].split("/")[0]
    return _ended(stack, "promote_model", unquote(run_id))


def _ended(stack: Any, dag_id: str, run_id: str, timeout: float = 240.0) -> dict:
    """The run, once it has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = stack.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}")
        if run["state"] in ("success", "failed"):
            return run
        time.sleep(2.0)
    pytest.fail(f"{dag_id} run {run_id} did not end in {timeout:.0f} s: {run}")


def test_a_drifted_night_is_refused_with_one_alert_naming_every_reason(
        dev_airflow: Any, alert_receivers: Any, tmp_path: Any):
    """The demo's days as a team's own images: two normal days train production, the
    drifted third day is refused by validate_data, and one alert says every reason."""
    from training.data.sources.demo import write_demo_partitions
    from training.data.sources.landing import land

    stack, (smtp, webhook) = dev_airflow, alert_receivers
    incoming, labelled = tmp_path / "incoming", str(stack.root / "var" / "people-labelled")
    days = [p["partition"] for p in
            write_demo_partitions(incoming, days=3, drift_day=3)["partitions"]]
    for partition in days[:2]:
        land(incoming, labelled, partition)
    conf = {"model_name": "people-own", "dataset": "team_digits", "data_source": "images",
            "data_uri": labelled, "image_shape": "8x8x1", "epochs": 2,
            "min_accuracy": 0.3, "data_until": days[1].removeprefix("dt=")}
    first = _trigger(stack, DAG_ID, conf)
    assert _ended(stack, DAG_ID, first, timeout=420.0)["state"] == "success", \
        stack.diagnostics(first)
    land(incoming, labelled, days[2])
    drifted = _trigger(stack, DAG_ID, {**conf, "data_until": days[2].removeprefix("dt="),
                                       "window_days": 1})
    assert _ended(stack, DAG_ID, drifted)["state"] == "failed"
    assert stack.task_states(drifted)["validate_data"] == "failed"
    alert = _wait_for_alert(webhook, drifted, "validation_refused")
    assert alert["subject"] == f"data validation refused the night: {DAG_ID} run {drifted}"
    assert alert["lines"][0].startswith("the staged data failed validation")
    assert any(line.startswith("drift:") for line in alert["lines"]), alert["lines"]
    assert _webhook_kinds(webhook, drifted)["validation_refused"] == 1
    assert "task_failed" not in _webhook_kinds(webhook, drifted)  # one alert, not two
    assert _mailed(smtp, f"data validation refused the night: {DAG_ID} run {drifted}") == 1
