"""Fixtures of the system tests: ``./dev airflow`` from a fresh copy, and a browser.

See ``support/devstack.py`` for how the stack is started as a new user starts it. The
stack is started as a deployment configures alerts (docs/alerts.md): two connections
pointing at an SMTP server and a webhook receiver on 127.0.0.1 that live as long as it,
and a deadline of ``DEADLINE_MINUTES`` on ``keras_retrain`` runs.
"""

from __future__ import annotations

import pytest
from support.browser import browser  # noqa: F401 - the fixture, shared with tests/deploy
from support.devstack import DevAirflow, running
from support.fresh import fresh_copy
from support.receivers import (
    email_connection,
    smtp_receiver,
    webhook_connection,
    webhook_receiver,
)

# The shortest deadline there is (whole minutes): a run reaches its approval in about
# 25 s here, so the run left waiting passes it while it waits (a run of another test
# that outlives it only adds a "late" alert, which no other test counts). Two minutes
# cost the people-in-the-loop walk a minute of waiting.
DEADLINE_MINUTES = 1
WEBHOOK_PATH = "/hooks/training"


@pytest.fixture(scope="session")
def alert_receivers():
    """(SMTP server, webhook receiver) on 127.0.0.1, for the whole session's stack."""
    with smtp_receiver() as smtp, webhook_receiver() as webhook:
        yield smtp, webhook


@pytest.fixture(scope="session")
def dev_airflow(tmp_path_factory: pytest.TempPathFactory, alert_receivers):
    """``./dev airflow`` from a fresh copy of the tree, ready, with its login read."""
    smtp, webhook = alert_receivers
    env = {"AIRFLOW_CONN_TRAINING_ALERTS_EMAIL": email_connection(smtp.server_address[1]),
           "AIRFLOW_CONN_TRAINING_ALERTS_WEBHOOK": webhook_connection(
               webhook.server_address[1], WEBHOOK_PATH),
           "TRAINING_DEADLINE_MINUTES": str(DEADLINE_MINUTES)}
    root = fresh_copy(tmp_path_factory.mktemp("journey") / "clone")
    with running(DevAirflow(root, env)) as stack:
        yield stack
