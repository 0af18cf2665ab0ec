"""System: the README's first journey, walked in a browser as a person clicks it.

``./dev airflow`` runs from a fresh copy of the tree (``conftest.py``). Headless
Chromium logs in with the login that ``./dev airflow`` printed, opens the DAG from the
Dags list, opens the Trigger form and submits it with its defaults, and once that run
has succeeded submits it again with two fields changed (the epochs, and the Keras
backend set to ``jax``: that run trains on JAX, with no TensorFlow in the training
process); then it follows the ``publish``
task's "Model version" extra link to the Models page, opens the report, goes back to
the page and follows the version's Airflow run link back into the UI. A second test
types an invalid value into the form and checks that Airflow refuses it, in words,
naming the field, and that no run is created.

Screenshots of every step go to ``$TEST_ARTIFACTS_DIR`` (default ``artifacts/``) under
``journey-*.png``. The REST API is read beside the browser to find runs and wait for
them; nothing is triggered through it.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import pytest
from support.airflow_ui import (
    click_until,
    dag_page,
    new_run,
    open_trigger_form,
    shot,
    submit_button,
)
from support.devstack import DAG_ID

from training.registry import open_store
from training.registry.versions import ModelRegistry
from training.train import models

pytestmark = pytest.mark.slow

MODEL = "digits-mlp"  # the default dataset and model, no model_name: <dataset>-<model>
CHANGED_EPOCHS = "4"
TASKS = ("stage_dataset", "train", "evaluate", "publish", "promote")


def check_task_costs(stack: Any, dag_run_id: str, version: str) -> None:
    """Each step ran in a process of its own (LocalExecutor): none loaded TensorFlow,
    tfds or Keras (its record says), and its log's first line of ours is the timing."""
    records = {p.stem: json.loads(p.read_text()) for p in
               (stack.root / "var" / "runs" / version / "airflow").glob("*.json")}
    assert set(records) == {"stage_dataset", "validate_data", "plan_trials", "train",
                            "evaluate", "publish", "promote"}, sorted(records)
    assert {t: r["heavy_modules"] for t, r in records.items()} == {t: [] for t in records}
    for log in stack.task_logs(dag_run_id):
        if log.parent.name.removeprefix("task_id=") not in records:
            continue  # approve_promotion: Airflow's own approval operator, no step record
        ours = [json.loads(line)["event"] for line in log.read_text().splitlines()
                if '"logger":"airflow.task.operators.training_airflow' in line]
        assert re.fullmatch(r"timing: queued [\d.]+ s, started [\d.]+ s, imports [\d.]+ s, "
                            r"work follows", ours[0]), (log, ours[:3])
        assert re.fullmatch(r"timing: .*, work [\d.]+ s", ours[-1]), (log, ours[-3:])


def test_trigger_form_runs_and_links_to_the_models_page(dev_airflow: Any, browser: Any):
    from playwright.sync_api import expect

    stack = dev_airflow
    page = dag_page(browser, stack)
    shot(page, "01-dag")

    # 1. The form opens valid with its defaults, and is submitted as it is. Its Model
    # section suggests every registered model and has the backbone's fine-tuning.
    dialog = open_trigger_form(page)
    expect(submit_button(dialog)).to_be_enabled()
    shot(page, "02-trigger-form-defaults")
    dialog.get_by_role("button", name="Model", exact=True).click()
    shot(page, "03-trigger-form-model-section")
    expect(dialog.get_by_role("spinbutton", name="Freeze epochs")).to_have_value("0")
    expect(dialog.get_by_text("Model weights", exact=True)).to_be_visible()
    expect(dialog.locator("#element_model_weights")).to_have_value("")  # no weights
    offered = dialog.locator("datalist option")
    expect(offered).to_have_count(len(models.names()))
    assert [o.get_attribute("value") for o in offered.all()] == models.names()
    known = {r["dag_run_id"] for r in stack.runs()}
    submit_button(dialog).click()
    expect(dialog).to_be_hidden()
    first = new_run(stack, known)
    known.add(first["dag_run_id"])
    defaults = {k: v for k, v in first["conf"].items() if v is not None}
    assert defaults["epochs"] == 30 and defaults["model"] == "mlp", first["conf"]

    ended = stack.wait_for_run(first["dag_run_id"])
    states = stack.task_states(first["dag_run_id"])
    assert ended["state"] == "success", (states, stack.diagnostics(first["dag_run_id"]))

    # 2. Again, once the first has finished, with one field changed in the form.
    dialog = open_trigger_form(page)
    dialog.get_by_role("button", name="Training").click()
    epochs = dialog.get_by_role("spinbutton", name="Epochs")
    expect(epochs).to_have_value("30")
    epochs.fill(CHANGED_EPOCHS)
    epochs.blur()
    shot(page, "04-trigger-form-epochs-changed")
    dialog.get_by_role("button", name="Hardware and distribution").click()
    dialog.locator("#element_backend").click()
    page.get_by_role("option", name="jax", exact=True).click()
    shot(page, "04b-trigger-form-backend-jax")
    expect(submit_button(dialog)).to_be_enabled()
    submit_button(dialog).click()
    expect(dialog).to_be_hidden()
    second = new_run(stack, known)
    assert second["conf"]["epochs"] == int(CHANGED_EPOCHS), second["conf"]
    assert second["conf"]["backend"] == "jax", second["conf"]
    ended = stack.wait_for_run(second["dag_run_id"])
    states = stack.task_states(second["dag_run_id"])
    assert ended["state"] == "success", (states, stack.diagnostics(second["dag_run_id"]))
    assert states["publish"] == "success", states
    registry = ModelRegistry(open_store(stack.store_uri))
    v1 = stack.xcom(first["dag_run_id"], "publish")["version"]
    v2 = stack.xcom(second["dag_run_id"], "publish")["version"]
    assert registry.production(MODEL) == v1  # the first model had nothing to beat
    second_decision = stack.xcom(second["dag_run_id"], "evaluate")["decision"]
    assert stack.task_states(second["dag_run_id"])["promote"] == (
        "success" if second_decision["promote"] else "skipped")

    # Beside the browser, over REST and in the store: XCom carries a small summary, never
    # the model; the version is complete, knows its Airflow run, and is the one promoted;
    # the value changed in the form reached the trained model.
    published = stack.xcom(first["dag_run_id"], "publish")
    assert set(published) == {"model_name", "version", "store_uri", "files", "metrics"}
    assert len(json.dumps(published)) < 2048 and published["store_uri"] == stack.store_uri
    manifest = registry.verify(MODEL, v1)
    assert manifest["metrics"] == published["metrics"]
    assert len(manifest["files"]) == published["files"]
    assert manifest["source"] == {"dag_id": DAG_ID, "run_id": first["dag_run_id"]}
    assert registry.history(MODEL)[0] | {"at": None, "reason": None} == {
        "from": None, "to": v1, "run_id": v1, "forced": False, "action": "promoted",
        "at": None, "reason": None}
    config = json.loads(registry.store.get_bytes(f"models/{MODEL}/versions/{v2}/config.json"))
    assert config["fit"]["epochs"] == int(CHANGED_EPOCHS)
    assert config["runtime"]["backend"] == "jax"
    run = json.loads(registry.store.get_bytes(f"models/{MODEL}/versions/{v2}/run.json"))
    assert run["strategy"]["backend"] == "jax" and "tensorflow" not in run["software"]
    check_task_costs(stack, first["dag_run_id"], v1)
    check_task_costs(stack, second["dag_run_id"], v2)

    # 3. The publish task of the first run links to its version on the Models page.
    page.goto(f"{stack.base_url}/dags/{DAG_ID}/runs/{first['dag_run_id']}/tasks/publish")
    click_until(page, page.get_by_role("link", name="Details"), r"/tasks/publish/details$")
    link = page.get_by_role("link", name="Model version")
    expect(link).to_have_attribute("href", f"/models/#{MODEL}/{v1}")
    shot(page, "05-publish-task-extra-link")
    link.click()
    expect(page).to_have_url(f"{stack.base_url}/models/#{MODEL}/{v1}")
    row = page.locator(f'tr.version[id="{MODEL}/{v1}"]')
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_text("production")
    assert row.evaluate("element => element.matches(':target')"), "the linked row is not targeted"
    model = page.locator(f'section[data-model="{MODEL}"]')
    # Most recently published first: the second run's version, then the first's.
    rows = model.locator("table.versions tbody tr")
    expect(rows.first).to_have_attribute("data-version", v2)
    expect(rows.nth(1)).to_have_attribute("data-version", v1)
    expect(row.locator("a.airflow-run")).to_have_text(first["dag_run_id"])
    expect(row.locator("td.backend")).to_have_text("tensorflow")
    expect(rows.first.locator("td.backend")).to_have_text("jax")  # the second run's
    expect(row.locator("td.images-per-s")).to_have_text(re.compile(r"^[\d,]+$"))
    shot(page, "06-models-page")

    # 4. The report of that version, and back to the page.
    row.get_by_role("link", name="report").click()
    expect(page.locator("h1")).to_have_text(f"{MODEL} version {v1}")
    expect(page.locator(".verdict")).to_have_text("promote to production")
    shot(page, "07-report")
    page.get_by_role("link", name="Models page").click()
    expect(page).to_have_url(f"{stack.base_url}/models/#{MODEL}/{v1}")

    # 5. From the version back to the Airflow run that produced it.
    page.locator(f'tr.version[id="{MODEL}/{v2}"] a.airflow-run').click()
    expect(page).to_have_url(re.compile(
        re.escape(f"{stack.base_url}/dags/{DAG_ID}/runs/") + ".+"))
    assert second["dag_run_id"] in page.url.replace("%3A", ":").replace("%2B", "+"), page.url
    expect(page.get_by_text("Success").first).to_be_visible()
    shot(page, "08-back-to-the-run")
    page.close()


SWEEP_SPACE = {"fit.learning_rate": {"float": [0.0003, 0.03], "log": True}}


def test_a_sweep_from_the_form_runs_its_trials_as_mapped_tasks(dev_airflow: Any, browser: Any):
    """The form's Hyperparameter sweep section: a space that is not a JSON object is
    refused in words when the run is triggered; a valid sweep, its space typed into the
    field's JSON editor, runs one mapped `trial` per trial, each named by its values
    (read over REST), and its best trial is published."""
    from playwright.sync_api import expect

    stack = dev_airflow
    page = dag_page(browser, stack)
    known = {r["dag_run_id"] for r in stack.runs()}
    dialog = open_trigger_form(page)
    dialog.get_by_role("button", name="Training").click()
    epochs = dialog.get_by_role("spinbutton", name="Epochs")
    epochs.fill("2")
    epochs.blur()
    dialog.get_by_role("button", name="Model registry").click()
    dialog.locator("#element_model_name").fill("digits-swept-form")
    dialog.get_by_role("button", name="Hyperparameter sweep").click()
    trials = dialog.get_by_role("spinbutton", name="Sweep trials")
    expect(trials).to_have_value("0")  # off by default
    trials.fill("3")
    trials.blur()
    parallel = dialog.get_by_role("spinbutton", name="Sweep parallel")
    parallel.fill("2")
    parallel.blur()
    editor = dialog.locator("#element_sweep_space")  # a code editor (Monaco)

    page.context.grant_permissions(["clipboard-read", "clipboard-write"],
                                   origin=stack.base_url)

    def type_space(text: str) -> None:
        """Pasted, as a person pastes JSON (typed, the editor closes brackets itself)."""
        page.evaluate("text => navigator.clipboard.writeText(text)", text)
        editor.click()  # focuses its text input
        page.keyboard.press("Control+A")
        page.keyboard.press("Control+V")
        parallel.click()  # leaves the editor: the form takes its value
        page.wait_for_timeout(500)

    type_space(json.dumps(list(SWEEP_SPACE)))  # a list of fields, not fields to ranges
    submit_button(dialog).click()
    alert = dialog.get_by_text("Invalid input for param sweep_space")
    expect(alert).to_be_visible()
    expect(alert).to_contain_text("is not of type 'object'")
    shot(page, "10-sweep-space-not-an-object-refused")
    assert {r["dag_run_id"] for r in stack.runs()} == known
    type_space(json.dumps(SWEEP_SPACE))
    shot(page, "11-trigger-form-sweep")
    expect(submit_button(dialog)).to_be_enabled()
    submit_button(dialog).click()
    expect(dialog).to_be_hidden()
    run = new_run(stack, known)
    conf = run["conf"]
    assert (conf["sweep_trials"], conf["sweep_parallel"], conf["epochs"]) == (3, 2, 2), conf
    assert conf["sweep_space"] == SWEEP_SPACE, conf
    ended = stack.wait_for_run(run["dag_run_id"], timeout=900.0)
    assert ended["state"] == "success", (stack.task_states(run["dag_run_id"]),
                                         stack.diagnostics(run["dag_run_id"]))
    mapped = stack.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/"
                                  f"{quote(run['dag_run_id'])}/taskInstances/trial/listMapped")
    instances = sorted(mapped["task_instances"], key=lambda ti: ti["map_index"])
    assert [ti["map_index"] for ti in instances] == [0, 1, 2], mapped
    assert all(ti["state"] == "success" for ti in instances), mapped
    for ti in instances:
        assert re.fullmatch(rf"t{ti['map_index']} learning_rate=[\d.e-]+",
                            ti["rendered_map_index"]), ti["rendered_map_index"]
    picked = stack.xcom(run["dag_run_id"], "train")["run_id"]
    assert stack.xcom(run["dag_run_id"], "publish")["version"] == picked
    sweep = json.loads(open_store(stack.store_uri).get_bytes(
        f"models/digits-swept-form/versions/{picked}/sweep.json"))
    assert sweep["counts"]["trials"] == 3 and picked.endswith(f"-t{sweep['best']['number']}")
    # The grid names each trial by its values.
    page.goto(f"{stack.base_url}/dags/{DAG_ID}/runs/{run['dag_run_id']}/tasks/trial/mapped")
    expect(page.get_by_text(re.compile(r"^t0 learning_rate=")).first).to_be_visible()
    shot(page, "12-sweep-trials-named-by-their-values")
    # The Models page says where the version came from, and links to the report's sweep.
    page.goto(f"{stack.base_url}/models/#digits-swept-form/{picked}")  # its version link
    row = page.locator(f'tr.version[id="digits-swept-form/{picked}"]')
    line = re.compile(r"best of 3 trials \(\d pruned, 0 failed\)")  # median pruner
    expect(row.locator(".sweep")).to_have_text(line)
    shot(page, "13-models-page-best-of-the-sweep")
    row.locator(".sweep a").click()
    expect(page.locator("h1")).to_have_text(f"digits-swept-form version {picked}")
    expect(page.get_by_text(line).first).to_be_visible()
    shot(page, "14-report-sweep-section")
    page.close()


def test_trigger_form_refuses_an_invalid_value_in_words(dev_airflow: Any, browser: Any):
    from playwright.sync_api import expect

    stack = dev_airflow
    page = dag_page(browser, stack)
    before = len(stack.runs())
    dialog = open_trigger_form(page)
    dialog.get_by_role("button", name="Model registry").click()
    dialog.locator("#element_model_name").fill("my model")
    submit_button(dialog).click()
    alert = dialog.get_by_text("Invalid input for param model_name")
    expect(alert).to_be_visible()
    expect(alert).to_contain_text("'my model' is not a")
    expect(alert).to_contain_text("registry name of 1 to 128 letters, digits")
    shot(page, "09-invalid-value-refused")
    assert len(stack.runs()) == before
    page.close()
