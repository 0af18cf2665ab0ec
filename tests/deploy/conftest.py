"""Fixtures of the deployment tests: ``./dev stack`` from a fresh copy, and a browser.

One stack for every deployment test (``support/prodstack.py``): PostgreSQL, Redis, SeaweedFS,
Airflow with the CeleryExecutor and its two workers, started as the README starts it.
"""

from __future__ import annotations

import pytest
from support.browser import browser  # noqa: F401 - the fixture, shared with tests/system
from support.devstack import running
from support.fresh import fresh_copy
from support.prodstack import DevStack


@pytest.fixture(scope="session")
def production_stack(tmp_path_factory: pytest.TempPathFactory):
    """``./dev stack`` from a fresh copy of the tree, ready, with its login read."""
    clone = fresh_copy(tmp_path_factory.mktemp("production") / "clone")
    with running(DevStack(clone), "dev-stack-logs.tar.gz") as stack:
        yield stack
