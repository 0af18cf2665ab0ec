"""The ``browser`` fixture: Debian's Chromium through Playwright, for the UI journeys of
``tests/system`` and ``tests/deploy`` (nothing downloaded at run time)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.devstack import CHROMIUM


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright (nothing downloaded at run time). Module
    scope: Playwright's sync API runs an event loop that must be gone before other
    modules use asyncio or Playwright themselves."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (./dev test installs Debian's package)")
    from playwright.sync_api import expect, sync_playwright

    # Assertions wait as long as actions (30 s), not Playwright's 5 s: on a loaded
    # 2-core machine the UI can take longer than that to draw a page.
    expect.set_options(timeout=30_000)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--no-sandbox", "--disable-gpu",
                                           "--disable-dev-shm-usage"])
        try:
            yield browser
        finally:
            browser.close()
