"""Alerts: the team hears when a night fails, when data is refused, when a model changes
hands and when a run misses its deadline, by e-mail and through a JSON webhook.

Both channels are Airflow connections named by the deployment
(``Deployment.alert_email_conn_id``, ``alert_webhook_conn_id``; docs/alerts.md): an
SMTP server whose extra says ``"to"``, and an HTTP endpoint that receives
``{"kind", "subject", "text", "lines", "links", "dag_id", "run_id"}`` (chat tools show
``text``). An alert is never worth a failed run: a connection that does not exist sends
nothing, and a receiver that is down or refuses is logged (with the connection id, never
its URL or password) and reported by ``send``, never raised.

The builders (``task_failed``, ``promoted``, ``rejected``, ``approval_timed_out``,
``mirror_missed``)
return an ``Alert``; ``on_task_failure`` is an operator's ``on_failure_callback`` and
``deadline_missed`` the ``AsyncCallback`` of a ``DeadlineAlert`` (it runs on the
triggerer, by dotted path). Links point at the UI under ``[api] base_url``.

Over 300 lines on purpose: what an alert says and how it travels are one idea, read
together (a line of the message is checked against what each receiver got), and the
DAGs and operators import one module for both.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from training.deployment import Deployment, alert_conn_ids_from_env

log = logging.getLogger(__name__)

SUBJECT_PREFIX = "[training] "
TIMEOUT_S = 10  # a receiver slower than this is down, as far as a run is concerned
VALIDATE_TASK = "validate_data"
VALIDATION_FAILED = "the staged data failed validation"  # training.data.snapshot.validation
DEFAULT_BASE_URL = "http://localhost:8080"  # Airflow's own fallback for ti.log_url


@dataclass(frozen=True)
class Alert:
    """One message, the same on every channel."""

    kind: str  # task_failed, validation_refused, promoted, rejected, ...
    subject: str
    lines: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)
    dag_id: str = ""
    run_id: str = ""

    def text(self) -> str:
        """The subject, the lines, then the links as ``name: url``."""
        return "\n".join([self.subject, *self.lines,
                          *(f"{name}: {url}" for name, url in self.links.items())])

    def payload(self) -> dict[str, Any]:
        """What the webhook receives."""
        return {"kind": self.kind, "subject": self.subject, "text": self.text(),
                "lines": list(self.lines), "links": dict(self.links),
                "dag_id": self.dag_id, "run_id": self.run_id}


# --- links -----------------------------------------------------------------------------

def ui_url(*segments: str, **query: Any) -> str:
    """``[api] base_url`` + the quoted path segments (+ the query)."""
    from airflow.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or DEFAULT_BASE_URL).rstrip("/")
    url = base + "".join("/" + quote(str(s), safe="") for s in segments)
    return f"{url}?{urlencode(query)}" if query else url


def run_url(dag_id: str, run_id: str) -> str:
    return ui_url("dags", dag_id, "runs", run_id)


def task_log_url(dag_id: str, run_id: str, task_id: str, try_number: int | None = None,
                 map_index: int = -1) -> str:
    """The task's Logs tab (the UI route ``dags/:dagId/runs/:runId/tasks/:taskId``,
    ``/mapped/:mapIndex`` for a mapped one; ``?try_number=`` picks the try)."""
    mapped = ("mapped", map_index) if map_index is not None and map_index >= 0 else ()
    query = {"try_number": try_number} if try_number else {}
    return ui_url("dags", dag_id, "runs", run_id, "tasks", task_id, *mapped, **query)


# --- builders --------------------------------------------------------------------------

def error_line(exc: Any) -> str:
    """The exception's type (its cause's, when it wraps one) and the last non-empty line
    of its message: a one-line message is whole, and a multi-line one (a child's
    output, a traceback) ends with the line that says what went wrong."""
    if exc is None:
        return "no exception was recorded (killed, timed out or lost its worker?)"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else "(no message)"
    last = last if len(last) <= 300 else last[:300] + "..."
    if not isinstance(exc, BaseException):
        return last
    return f"{type(exc.__cause__ or exc).__name__}: {last}"


def _refusal(task_id: str, exc: Any) -> list[str] | None:
    """The summary and every reason when ``validate_data`` failed on the data (not when
    it failed for another cause, say the store being down)."""
    from training.errors import ValidationError

    if task_id != VALIDATE_TASK or exc is None:
        return None
    if not (isinstance(exc, ValidationError)
            or isinstance(getattr(exc, "__cause__", None), ValidationError)
            or str(exc).startswith(VALIDATION_FAILED)):
        return None
    first, *reasons = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return [first.rstrip(":"), *reasons]


def task_failed(context: Any) -> Alert:
    """The task that failed (after its retries), its error and a link to its log; for
    ``validate_data`` refusing the data, "data validation refused the night" with every
    reason instead."""
    ti = context.get("ti") or context["task_instance"]
    dag_id, run_id, task_id = ti.dag_id, ti.run_id, ti.task_id
    try_number = getattr(ti, "try_number", None)
    exc = context.get("exception")
    links = {"log": task_log_url(dag_id, run_id, task_id, try_number,
                                 getattr(ti, "map_index", -1)),
             "run": run_url(dag_id, run_id)}
    reasons = _refusal(task_id, exc)
    if reasons is not None:
        return Alert("validation_refused",
                     f"data validation refused the night: {dag_id} run {run_id}",
                     reasons, links, dag_id, run_id)
    return Alert("task_failed", f"{dag_id}: {task_id} failed in run {run_id}",
                 [f"task: {task_id} (try {try_number})", f"error: {error_line(exc)}"],
                 links, dag_id, run_id)


def on_task_failure(context: Any) -> dict[str, str] | None:
    """An operator's ``on_failure_callback``: Airflow calls it once the task has failed
    for good (after its retries); sends ``task_failed(context)``. Never raises."""
    try:
        return send(task_failed(context))
    except Exception:  # noqa: BLE001 - an alert never fails anything
        log.exception("the failure alert could not be built or sent")
        return None


def _listed(reasons: Any) -> list[str]:
    if not reasons:
        return []
    return [reasons] if isinstance(reasons, str) else [str(r) for r in reasons]


def promoted(model_name: str, version: str, previous: str | None, reasons: Any,
             by: str | None, links: dict[str, str], *, dag_id: str = "",
             run_id: str = "") -> Alert:
    """A version went to production: what it replaced, who decided, why."""
    return Alert("promoted", f"{model_name} {version} is now in production", [
        f"previous production version: {previous or 'none (the first one)'}",
        f"promoted by: {by or 'the evaluation (no approval was asked)'}",
        *(f"why: {reason}" for reason in _listed(reasons))], dict(links), dag_id, run_id)


def rejected(model_name: str, version: str, reviewer: str, reason: str,
             links: dict[str, str], *, dag_id: str = "", run_id: str = "") -> Alert:
    """A reviewer said no: production is unchanged."""
    return Alert("rejected", f"{model_name} {version} was rejected by {reviewer}", [
        f"reviewer: {reviewer}", f"reason: {reason or 'none given'}",
        "production is unchanged"], dict(links), dag_id, run_id)


def mirror_missed(model_name: str, version: str, missed: list[str], *, dag_id: str = "",
                  run_id: str = "") -> Alert:
    """Production moved, and MLflow's registry did not follow (``tracking.py``)."""
    return Alert("mlflow_mirror_failed", f"MLflow did not follow {model_name}: "
                 f"{version} is in production, champion may point elsewhere", [
                     *(f"not sent: {line}" for line in missed[:5]),
                     *([f"and {len(missed) - 5} more"] if len(missed) > 5 else []),
                     "production.json moved and stays the truth; `python -m training "
                     "models sync-mlflow` repairs MLflow's registry"],
                 {"run": run_url(dag_id, run_id)} if dag_id else {}, dag_id, run_id)


def _duration(waited: Any) -> str:
    if not isinstance(waited, timedelta):
        return str(waited)
    minutes = int(waited.total_seconds() // 60)
    hours, minutes = divmod(minutes, 60)
    return " ".join(part for part in (f"{hours} h" if hours else "",
                                      f"{minutes} min" if minutes or not hours else "") if part)


def approval_timed_out(model_name: str, version: str, waited: Any, links: dict[str, str],
                       *, dag_id: str = "", run_id: str = "") -> Alert:
    """Nobody answered the approval request in time: not promoted."""
    return Alert("approval_timed_out",
                 f"{model_name} {version}: no approval within {_duration(waited)}", [
                     f"nobody answered the approval request within {_duration(waited)}",
                     "the version was not promoted; production is unchanged"],
                 dict(links), dag_id, run_id)


async def deadline_missed(context: Any = None, **kwargs: Any) -> str:
    """The ``AsyncCallback`` of the DAG's ``DeadlineAlert`` (the triggerer imports it
    as ``training_airflow.alerts.deadline_missed``): the run is not finished by its
    deadline. ``context``: ``{"dag_run": <the run as the REST API shows it>,
    "deadline": {"id", "deadline_time"}}``; other keyword arguments are ignored.
    Returns what happened as one line: Airflow 3.3 stores the callback's return value
    in a text column, and a dict there crashed the triggerer on SQLite."""
    import asyncio  # here: the DAG file imports this module at every parse

    run = (context or {}).get("dag_run") or {}
    deadline = (context or {}).get("deadline") or {}
    dag_id = run.get("dag_id") or "keras_retrain"
    run_id = run.get("dag_run_id") or run.get("run_id") or "?"
    lines = [f"deadline: {deadline.get('deadline_time', '?')}",
             f"state: {run.get('state', '?')}",
             f"queued at: {run.get('queued_at')}, started at: {run.get('start_date')}",
             f"started by: {run.get('triggering_user_name') or run.get('run_type', '?')}"]
    alert = Alert("deadline_missed", f"{dag_id} run {run_id} not finished by its deadline",
                  lines, {"run": run_url(dag_id, run_id)}, dag_id, run_id)
    outcome = await asyncio.to_thread(send, alert)
    return ", ".join(f"{channel} {what}" for channel, what in outcome.items())


# --- sending ---------------------------------------------------------------------------

def _conn_ids(deployment: Deployment | None) -> tuple[str, str]:
    """The deployment's alert connections; read alone without one, so a wrong store URI
    (which may be what the alert reports) never mutes alerts."""
    if deployment is None:
        return alert_conn_ids_from_env()
    return deployment.alert_email_conn_id, deployment.alert_webhook_conn_id


def send(alert: Alert, deployment: Deployment | None = None) -> dict[str, str]:
    """Send ``alert`` through each configured connection (``deployment``'s, default
    ``alert_conn_ids_from_env()``). Returns per channel ``"sent"``, ``"not configured"``
    (no such connection) or ``"failed: <why>"``; never raises."""
    email_id, webhook_id = _conn_ids(deployment)
    outcome = {"email": _deliver("email", email_id, alert, _send_email),
               "webhook": _deliver("webhook", webhook_id, alert, _post_webhook)}
    log.info("alert %s (%s): %s", alert.kind, alert.subject,
             ", ".join(f"{channel} {what}" for channel, what in outcome.items()))
    return outcome


def _deliver(channel: str, conn_id: str, alert: Alert, sender: Any) -> str:
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    conn = None
    try:
        try:
            conn = Connection.get(conn_id)
        except AirflowNotFoundException:
            log.info("no %s alert: there is no connection %r", channel, conn_id)
            return "not configured"
        sender(alert, conn)
    except Exception as exc:  # noqa: BLE001 - a receiver that is down fails no run
        why = _redacted(f"{type(exc).__name__}: {exc}", conn, channel)
        log.warning("the %s alert %r was not sent through connection %r: %s", channel,
                    alert.kind, conn_id, why)
        return f"failed: {why}"
    return "sent"


def _redacted(text: str, conn: Any, channel: str) -> str:
    """``text`` without the connection's password, nor, for the webhook, its URL's path
    and query (a webhook's path is often its secret)."""
    secrets = [getattr(conn, "password", None)]
    if conn is not None and channel == "webhook":
        try:
            url = urlsplit(_webhook_url(conn))
            secrets += [url.path if len(url.path) > 1 else None, url.query]
        except Exception:  # noqa: BLE001 - no URL, nothing of it to hide
            pass
    for secret in filter(None, secrets):
        text = text.replace(secret, "***").replace(quote(secret), "***")
    return text


def _flag(value: Any) -> bool:
    """An extra's switch: true, "true", "1", "yes", "on"."""
    return value.strip().lower() in ("true", "1", "yes", "on") \
        if isinstance(value, str) else bool(value)


def _send_email(alert: Alert, conn: Any) -> None:
    """Plain text and HTML through the connection's SMTP server: SSL unless the extra
    says ``"disable_ssl"``, then STARTTLS unless ``"disable_tls"`` (the smtp provider's
    switches); the login when it has one."""
    import re
    import smtplib
    import ssl

    extra = conn.extra_dejson
    to = [a for a in re.split(r"\s*[,;]\s*", str(extra.get("to") or "").strip()) if a]
    if not to:
        raise ValueError('the connection\'s extra has no "to" (comma-separated recipients)')
    context = ssl.create_default_context()
    if extra.get("ssl_context") == "none":
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    timeout = float(extra.get("timeout") or TIMEOUT_S)
    host, port = conn.host or "localhost", conn.port or 0
    if _flag(extra.get("disable_ssl")):
        client = smtplib.SMTP(host, port, timeout=timeout)
        starttls = not _flag(extra.get("disable_tls"))
    else:
        client = smtplib.SMTP_SSL(host, port, timeout=timeout, context=context)
        starttls = False
    with client:
        if starttls:
            client.starttls(context=context)
        if conn.login and conn.password:
            client.login(conn.login, conn.password)
        client.send_message(_email(alert, extra.get("from_email") or "airflow@localhost", to))


def _email(alert: Alert, sender: str, to: list[str]) -> Any:
    from email.message import EmailMessage
    from email.utils import formatdate, make_msgid
    from html import escape

    message = EmailMessage()
    message["Subject"] = SUBJECT_PREFIX + alert.subject
    message["From"], message["To"] = sender, ", ".join(to)
    message["Date"], message["Message-ID"] = formatdate(localtime=True), make_msgid()
    message["X-Training-Alert"] = alert.kind
    where = f"DAG {alert.dag_id}, run {alert.run_id}" if alert.dag_id else ""
    message.set_content("\n".join([alert.subject, "", *alert.lines, "",
                                   *(f"{name}: {url}" for name, url in alert.links.items()),
                                   *([""] + [where] if where else [])]) + "\n")
    links = " | ".join(f'<a href="{escape(url)}">{escape(name)}</a>'
                       for name, url in alert.links.items())
    message.add_alternative(
        f"<html><body><p><strong>{escape(alert.subject)}</strong></p>"
        + "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in alert.lines) + "</ul>"
        + (f"<p>{links}</p>" if links else "")
        + (f'<p style="color:#666">{escape(where)}</p>' if where else "")
        + "</body></html>\n", subtype="html")
    return message


def _webhook_url(conn: Any) -> str:
    """Like the http provider's HttpHook: ``host`` as a whole URL (its path too), or
    ``schema`` (default http) + ``host``; the ``port``, unless the URL has one; then the
    extra's ``endpoint``, if any."""
    host = conn.host or ""
    url = urlsplit(host if "://" in host else f"{conn.schema or 'http'}://{host}")
    if conn.port and url.port is None:
        url = url._replace(netloc=f"{url.netloc}:{conn.port}")
    base = url.geturl()
    endpoint = str(conn.extra_dejson.get("endpoint") or "")
    if endpoint and not base.endswith("/") and not endpoint.startswith("/"):
        return f"{base}/{endpoint}"
    return base + endpoint


def _post_webhook(alert: Alert, conn: Any) -> None:
    """POST the payload as JSON, with the connection's login (basic auth) and the
    extra's ``headers``; a status of 400 or more is a failure."""
    import requests

    response = requests.post(
        _webhook_url(conn), json=alert.payload(), timeout=TIMEOUT_S,
        headers=conn.extra_dejson.get("headers") or None,
        auth=(conn.login, conn.password or "") if conn.login else None)
    if response.status_code >= 400:
        raise RuntimeError(f"the receiver answered HTTP {response.status_code} "
                           f"{response.reason}")
