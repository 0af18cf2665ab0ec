"""Alerts arrive on real receivers: an SMTP server and an HTTP endpoint on 127.0.0.1,
started here, reached through Airflow connections given as ``AIRFLOW_CONN_<ID>``
variables (JSON). ``airflow.sdk.Connection.get``, which ``alerts.send`` uses, reads
them in a plain process (no database, no supervisor), in a task and on the triggerer.

The SMTP server is a few lines of ``socketserver`` speaking just enough SMTP (EHLO,
AUTH PLAIN, MAIL, RCPT, DATA, QUIT): the stdlib ``smtpd`` is deprecated, and nothing is
installed for it. The last test runs the real thing: a DAG whose tasks fail, with
``on_failure_callback=on_task_failure``, under ``dag.test()`` in a child process.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from support.receivers import (
    email_connection,
    mails,
    smtp_receiver,
    webhook_connection,
    webhook_receiver,
)

from training.data.snapshot.validation import require_valid
from training.errors import ValidationError
from training_airflow import alerts

BASE_URL = "https://airflow.example.org"
SECRET_PATH = "/hooks/T0123/s3cr3t-token"
REASONS = ["examples_per_class: class 7 has 3 examples, fewer than 10",
           "drift: label distribution moved by 0.41 (Jensen-Shannon distance), over 0.3"]


@pytest.fixture
def smtp_server():
    with smtp_receiver() as server:
        yield server


@pytest.fixture
def webhook():
    with webhook_receiver() as server:
        yield server


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _email_conn(port: int) -> str:
    return email_connection(port)


def _webhook_conn(port: int) -> str:
    return webhook_connection(port, SECRET_PATH)


@pytest.fixture
def connections(monkeypatch, smtp_server, webhook):
    """Both default connections point at the receivers; links under BASE_URL."""
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", BASE_URL)
    for name in ("TRAINING_ALERT_EMAIL_CONN_ID", "TRAINING_ALERT_WEBHOOK_CONN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_TRAINING_ALERTS_EMAIL",
                       _email_conn(smtp_server.server_address[1]))
    monkeypatch.setenv("AIRFLOW_CONN_TRAINING_ALERTS_WEBHOOK",
                       _webhook_conn(webhook.server_address[1]))
    return smtp_server, webhook


def _mails(smtp_server) -> list:
    return mails(smtp_server)


def _arrived_once(smtp_server, webhook, alert: alerts.Alert) -> tuple:
    """The one e-mail and the one webhook call, both saying what ``alert`` says."""
    [(sender, recipients, mail)] = _mails(smtp_server)
    [request] = webhook.requests
    assert sender == "airflow@example.org"
    assert recipients == ["ml-team@example.org", "oncall@example.org"]
    assert mail["Subject"] == "[training] " + alert.subject
    text = mail.get_body(("plain",)).get_content()
    html = mail.get_body(("html",)).get_content()
    for line in alert.lines:
        assert line in text
    for name, url in alert.links.items():
        assert f"{name}: {url}" in text and f'href="{url}"' in html
    assert request["path"] == SECRET_PATH
    assert request["headers"]["Authorization"] == "Basic " + base64.b64encode(
        b"bot:hook-pass").decode()
    assert request["json"] == {**alert.payload(), "text": alert.text()}
    assert request["json"]["text"].startswith(alert.subject + "\n" + "\n".join(alert.lines))
    assert smtp_server.logins == [("alerts", "smtp-pass")]
    return mail, request


def _context(task_id: str, exception: BaseException, try_number: int = 2) -> dict:
    ti = SimpleNamespace(dag_id="keras_retrain", run_id="scheduled__2026-12-01T03:00:00+00:00",
                         task_id=task_id, try_number=try_number, map_index=-1)
    return {"ti": ti, "exception": exception}


def _refusal() -> Exception:
    """What ValidateOperator raises: AirflowFailException with the ValidationError's text."""
    from airflow.sdk.exceptions import AirflowFailException

    checks = [{"name": n, "passed": False, "detail": ""} for n in range(5)]
    try:
        require_valid({"passed": False, "checks": checks, "reasons": REASONS})
    except ValidationError as exc:
        try:
            raise AirflowFailException(str(exc)) from exc
        except AirflowFailException as failed:
            return failed
    raise AssertionError("require_valid accepted a failed verdict")


# --- the builders, on both channels ----------------------------------------------------

def test_a_failed_task_says_which_try_failed_how_and_links_its_log(connections):
    try:
        raise RuntimeError("training exited with code 1:\n\nValueError: NaN loss at epoch 3\n")
    except RuntimeError as exc:
        context = _context("train", exc)
    alert = alerts.task_failed(context)
    assert alert.kind == "task_failed"
    assert alert.subject == ("keras_retrain: train failed in run "
                             "scheduled__2026-12-01T03:00:00+00:00")
    assert alert.lines == ["task: train (try 2)",
                           "error: RuntimeError: ValueError: NaN loss at epoch 3"]
    run = f"{BASE_URL}/dags/keras_retrain/runs/scheduled__2026-12-01T03%3A00%3A00%2B00%3A00"
    assert alert.links == {"log": f"{run}/tasks/train?try_number=2", "run": run}
    assert alerts.on_task_failure(context) == {"email": "sent", "webhook": "sent"}
    mail, request = _arrived_once(*connections, alert)
    assert mail["X-Training-Alert"] == "task_failed"
    assert request["json"]["dag_id"] == "keras_retrain"


def test_validation_refusing_the_data_is_one_alert_with_every_reason(connections):
    alert = alerts.task_failed(_context("validate_data", _refusal(), try_number=1))
    assert alert.kind == "validation_refused"
    assert alert.subject == ("data validation refused the night: keras_retrain run "
                             "scheduled__2026-12-01T03:00:00+00:00")
    assert alert.lines == [
        "the staged data failed validation (2 of 5 checks failed); fix the data and stage "
        "it under a new version", *REASONS]
    assert alert.links["log"].endswith("/tasks/validate_data?try_number=1")
    alerts.send(alert)
    _arrived_once(*connections, alert)


def test_validate_data_failing_for_another_cause_is_a_plain_failure():
    alert = alerts.task_failed(_context("validate_data", OSError("store unreachable")))
    assert alert.kind == "task_failed"
    assert alert.lines[-1] == "error: OSError: store unreachable"


@pytest.mark.parametrize("build, subject, lines", [
    (lambda links: alerts.promoted("digits", "run-7", "run-3", ["val_accuracy +0.02"],
                                   "alice", links),
     "digits run-7 is now in production",
     ["previous production version: run-3", "promoted by: alice",
      "why: val_accuracy +0.02"]),
    (lambda links: alerts.promoted("digits", "run-1", None, [], None, links),
     "digits run-1 is now in production",
     ["previous production version: none (the first one)",
      "promoted by: the evaluation (no approval was asked)"]),
    (lambda links: alerts.rejected("digits", "run-7", "bob", "worse on class 7", links),
     "digits run-7 was rejected by bob",
     ["reviewer: bob", "reason: worse on class 7", "production is unchanged"]),
    (lambda links: alerts.approval_timed_out("digits", "run-7", "1440 minutes", links),
     "digits run-7: no approval within 1440 minutes",
     ["nobody answered the approval request within 1440 minutes",
      "the version was not promoted; production is unchanged"]),
])
def test_model_alerts_say_what_happened_to_the_version(connections, build, subject, lines):
    links = {"report": f"{BASE_URL}/models/digits/versions/run-7/report/index.html"}
    alert = build(links)
    assert (alert.subject, alert.lines, alert.links) == (subject, lines, links)
    assert alerts.send(alert) == {"email": "sent", "webhook": "sent"}
    _arrived_once(*connections, alert)


def test_a_timedelta_wait_reads_in_hours_and_minutes():
    from datetime import timedelta

    alert = alerts.approval_timed_out("digits", "v", timedelta(hours=24, minutes=5), {})
    assert alert.subject == "digits v: no approval within 24 h 5 min"


DEADLINE_CONTEXT = {
    "dag_run": {"dag_id": "keras_retrain", "dag_run_id": "manual__2026-12-01T03:00:00+00:00",
                "state": "running", "run_type": "manual", "triggering_user_name": "alice",
                "queued_at": "2026-12-01T03:00:00Z", "start_date": "2026-12-01T03:00:05Z"},
    "deadline": {"id": "0190", "deadline_time": "2026-12-01T09:00:00Z"}}


def test_a_missed_deadline_is_sent_when_awaited(connections):
    outcome = asyncio.run(alerts.deadline_missed(context=DEADLINE_CONTEXT, unused="x"))
    assert outcome == "email sent, webhook sent"  # text: Airflow stores it in a text column
    [request] = connections[1].requests
    sent = request["json"]
    assert sent["subject"] == ("keras_retrain run manual__2026-12-01T03:00:00+00:00 "
                               "not finished by its deadline")
    assert "deadline: 2026-12-01T09:00:00Z" in sent["lines"]
    assert sent["links"] == {"run": f"{BASE_URL}/dags/keras_retrain/runs/"
                                    "manual__2026-12-01T03%3A00%3A00%2B00%3A00"}
    _arrived_once(*connections, alerts.Alert(**{k: v for k, v in sent.items()
                                                 if k != "text"}))


def test_the_triggerer_finds_the_deadline_callback_by_its_dotted_path(connections):
    """What a DeadlineAlert's AsyncCallback runs on the triggerer, by hand."""
    from airflow.triggers.callback import CallbackTrigger

    trigger = CallbackTrigger("training_airflow.alerts.deadline_missed",
                              {"context": DEADLINE_CONTEXT})

    async def events():
        return [event.payload async for event in trigger.run()]

    *_, last = asyncio.run(events())
    assert last == {"state": "success", "body": "email sent, webhook sent"}
    assert len(connections[0].messages) == len(connections[1].requests) == 1


# --- no connection, a receiver down ----------------------------------------------------

def test_no_connection_sends_nothing_and_fails_nothing(monkeypatch, smtp_server, webhook,
                                                        caplog):
    monkeypatch.setenv("TRAINING_ALERT_EMAIL_CONN_ID", "no_such_email")
    monkeypatch.setenv("TRAINING_ALERT_WEBHOOK_CONN_ID", "no_such_webhook")
    with caplog.at_level(logging.INFO, logger="training_airflow.alerts"):
        outcome = alerts.send(alerts.rejected("digits", "v", "bob", "no", {}))
    assert outcome == {"email": "not configured", "webhook": "not configured"}
    assert smtp_server.messages == [] and webhook.requests == []
    assert "there is no connection 'no_such_webhook'" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_deployment_names_the_connections(monkeypatch, connections):
    smtp_server, webhook = connections
    monkeypatch.setenv("TRAINING_ALERT_WEBHOOK_CONN_ID", "team_chat")
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_CHAT", json.dumps(
        {"conn_type": "http", "host": f"http://127.0.0.1:{webhook.server_address[1]}/chat"}))
    assert alerts.send(alerts.rejected("digits", "v", "bob", "no", {})) == {
        "email": "sent", "webhook": "sent"}
    assert [r["path"] for r in webhook.requests] == ["/chat"]


def test_a_receiver_down_is_logged_and_reported_never_raised(monkeypatch, caplog):
    port = _closed_port()
    monkeypatch.setenv("AIRFLOW_CONN_TRAINING_ALERTS_EMAIL", _email_conn(port))
    monkeypatch.setenv("AIRFLOW_CONN_TRAINING_ALERTS_WEBHOOK", _webhook_conn(port))
    with caplog.at_level(logging.INFO, logger="training_airflow.alerts"):
        outcome = alerts.on_task_failure(_context("train", RuntimeError("boom")))
    assert outcome["email"].startswith("failed: ConnectionRefusedError")
    assert outcome["webhook"].startswith("failed: ConnectionError")
    # Ours only: Airflow's secrets masker may add "Skipping masking for a secret as it's
    # too short", depending on what earlier tests in this process registered (CI: 3 == 2).
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "training_airflow.alerts"]
    assert len(warnings) == 2
    assert "connection 'training_alerts_email'" in warnings[0]
    assert "connection 'training_alerts_webhook'" in warnings[1]
    # Neither the webhook's secret path nor a password is written anywhere.
    for text in (caplog.text, json.dumps(outcome)):
        assert "s3cr3t" not in text and "smtp-pass" not in text and "hook-pass" not in text


def test_a_receiver_that_refuses_or_a_connection_without_recipients_fails_alone(
        monkeypatch, connections):
    smtp_server, webhook = connections
    webhook.status = 500
    extra_less = json.loads(_email_conn(smtp_server.server_address[1]))
    del extra_less["extra"]["to"]
    monkeypatch.setenv("AIRFLOW_CONN_TRAINING_ALERTS_EMAIL", json.dumps(extra_less))
    outcome = alerts.send(alerts.rejected("digits", "v", "bob", "no", {}))
    assert outcome == {
        "email": 'failed: ValueError: the connection\'s extra has no "to" '
                 "(comma-separated recipients)",
        "webhook": "failed: RuntimeError: the receiver answered HTTP 500 "
                   "Internal Server Error"}
    assert len(webhook.requests) == 1 and smtp_server.messages == []


# --- the real thing: dag.test() calls on_failure_callback ------------------------------

DAG_FILE = '''
from airflow.sdk import DAG, task
from airflow.sdk.exceptions import AirflowFailException

from training.data.snapshot.validation import require_valid
from training.errors import ValidationError
from training_airflow.alerts import on_task_failure

with DAG("alerting", schedule=None, default_args={"retries": 0,
                                                  "on_failure_callback": on_task_failure}):
    @task(task_id="validate_data")
    def validate():
        checks = [{"name": n, "passed": False, "detail": ""} for n in range(5)]
        try:
            require_valid({"passed": False, "checks": checks, "reasons": REASONS})
        except ValidationError as exc:
            raise AirflowFailException(str(exc)) from exc

    @task(task_id="train")
    def train():
        raise RuntimeError("training exited with code 1: NaN loss")

    validate()
    train()
'''


@pytest.mark.slow
def test_dag_test_sends_one_alert_per_failed_task(tmp_path, connections):
    import os

    smtp_server, webhook = connections
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags/alerting.py").write_text(
        f"REASONS = {REASONS!r}\n" + textwrap.dedent(DAG_FILE))
    home = tmp_path / "home"
    env = {**os.environ, "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"}
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   capture_output=True)
    run = subprocess.run(
        [sys.executable, "-c", "from airflow.dag_processing.dagbag import DagBag;"
         f"DagBag({str(tmp_path / 'dags')!r}).dags['alerting'].test()"],
        env=env, capture_output=True, text=True, timeout=300)
    assert "state=failed" in run.stdout + run.stderr, run.stdout[-3000:] + run.stderr[-3000:]
    kinds = sorted(r["json"]["kind"] for r in webhook.requests)
    assert kinds == ["task_failed", "validation_refused"]
    assert sorted(m["X-Training-Alert"] for _, _, m in _mails(smtp_server)) == kinds
    refused = next(r["json"] for r in webhook.requests if r["json"]["kind"] != "task_failed")
    assert refused["lines"][1:] == REASONS
    assert refused["links"]["log"].startswith(f"{BASE_URL}/dags/alerting/runs/manual__")
    assert refused["links"]["log"].endswith("/tasks/validate_data?try_number=1")
    failed = next(r["json"] for r in webhook.requests if r["json"]["kind"] == "task_failed")
    assert failed["lines"] == ["task: train (try 1)",
                               "error: RuntimeError: training exited with code 1: NaN loss"]
