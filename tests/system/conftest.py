"""Fixtures of the system tests: ``./dev airflow`` from a fresh copy, and a browser.

See ``support/devstack.py`` for how the stack is started as a new user starts it.
"""

from __future__ import annotations

import pytest
from support.browser import browser  # noqa: F401 - the fixture, shared with tests/deploy
from support.devstack import DevAirflow, running
from support.fresh import fresh_copy


@pytest.fixture(scope="session")
def dev_airflow(tmp_path_factory: pytest.TempPathFactory):
    """``./dev airflow`` from a fresh copy of the tree, ready, with its login read."""
    with running(DevAirflow(fresh_copy(tmp_path_factory.mktemp("journey") / "clone"))) as stack:
        yield stack
