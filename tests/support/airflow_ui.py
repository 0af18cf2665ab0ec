"""Airflow's UI as a person uses it, for the browser journeys: log in, open the DAG, open
its Trigger form, find the run the form created (read beside the UI, over REST)."""

from __future__ import annotations

import re
from typing import Any

from support.devstack import DAG_ID, USER, artifacts_dir


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(artifacts_dir() / f"journey-{name}.png"), full_page=True)


def log_in(page: Any, stack: Any) -> None:
    from playwright.sync_api import expect

    page.goto(stack.base_url + "/")
    expect(page.get_by_label("Username")).to_be_visible(timeout=30_000)
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(stack.password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("link", name="Dags", exact=True)).to_be_visible(timeout=30_000)


def dag_page(browser: Any, stack: Any) -> Any:
    """A new page, logged in, on the DAG's page (reached from the Dags list)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    log_in(page, stack)
    open_dag(page)
    return page


def open_dag(page: Any) -> None:
    from playwright.sync_api import expect

    page.get_by_role("link", name="Dags", exact=True).click()
    expect(page.get_by_text("3 Dags")).to_be_visible()  # keras_retrain, land_labelled_data,
    # promote_model
    page.get_by_role("link", name=DAG_ID, exact=True).first.click()
    expect(page).to_have_url(re.compile(rf"/dags/{DAG_ID}$"))
    expect(page.get_by_text("stage_dataset").first).to_be_visible()  # the DAG page is drawn


def open_trigger_form(page: Any) -> Any:
    """The header's Trigger button; once runs exist it is a menu: its "Trigger" entry."""
    from playwright.sync_api import expect

    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    fresh = page.get_by_role("menuitem", name="Trigger", exact=True)
    expect(dialog.or_(fresh)).to_be_visible()
    if fresh.is_visible():
        fresh.click()
    expect(dialog.get_by_text(f"Trigger Dag - {DAG_ID}")).to_be_visible()
    return dialog


def click_until(page: Any, link: Any, url: str, tries: int = 3) -> None:
    """Click ``link`` until the page is at ``url`` (a regular expression): a click that
    lands while a loaded machine is still drawing the page can be lost (seen under two
    test workers), and a person would click again."""
    from playwright.sync_api import expect

    for attempt in range(tries):
        link.click()
        try:
            expect(page).to_have_url(re.compile(url), timeout=10_000)
            return
        except AssertionError:
            if attempt == tries - 1:
                raise


def submit_button(dialog: Any) -> Any:
    return dialog.get_by_role("button", name="Trigger", exact=True)


def new_run(stack: Any, known: set[str], timeout_s: float = 30.0) -> dict:
    """The run the form just created (read beside the UI, over REST)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fresh = [r for r in stack.runs() if r["dag_run_id"] not in known]
        if fresh:
            assert len(fresh) == 1, fresh
            return fresh[0]
        time.sleep(0.5)
    raise AssertionError(f"no new run of {DAG_ID} {timeout_s:.0f} s after the form was submitted")
