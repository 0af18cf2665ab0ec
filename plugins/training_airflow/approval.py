"""A person's approval before a winning model goes to production (``approve_promotion``).

With ``promotion.require_approval`` on, the ``keras_retrain`` run waits between
``publish`` and ``promote`` for an answer in the Airflow UI's Required actions view
(Airflow 3.3's human-in-the-loop ``ApprovalOperator``: the task is ``awaiting_input``
and holds no worker slot while it waits). The request shows the decision, its reasons,
both models' metrics side by side, and links to the version's report and its row on the
Models page; the reviewer writes why.

- Approve: ``promote`` moves the pointer as always, recording who approved.
- Reject: nothing moves; ``promote`` is skipped; the rejection, its reviewer and reason
  go into the model's promotion history (``ModelRegistry.record_decision``) and an
  alert is sent.
- No answer within ``promotion.approval_timeout_minutes``: Airflow applies the default
  answer, Reject, with no reviewer: recorded as ``timed out``, not promoted, an alert.

A model that loses, or a run without ``require_approval``, never asks: the task
returns at once saying why, and ``promote`` does what the decision says.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param

CONFIG_TASK = "stage_dataset"  # the task that froze the run's config (XCom "config")


def request_links(model_name: str, version: str) -> dict[str, str]:
    """The version's report and its row on the Models page, under ``[api] base_url``."""
    from training_airflow.alerts import ui_url

    return {"report": ui_url("models", model_name, "versions", version, "report",
                             "index.html"),
            "models page": f"{ui_url('models')}/#{quote(model_name)}/{quote(version)}"}


def request_body(evaluation: dict[str, Any], links: dict[str, str]) -> str:
    """The request's Markdown: the decision, its reasons, both models side by side."""
    challenger, champion = evaluation["challenger"], evaluation.get("champion") or {}
    decision = evaluation["decision"]
    rows = ["| | this run's model | production |", "|---|---|---|",
            f"| version | {evaluation['version']} | {champion.get('version', 'none')} |"]
    for metric in ("accuracy", "loss", "macro_f1"):
        theirs = champion.get(metric)
        rows.append(f"| test {metric} | {challenger[metric]:.4f} | "
                    f"{'-' if theirs is None else format(theirs, '.4f')} |")
    holdout = evaluation.get("holdout") or {}
    if holdout.get("challenger"):
        theirs = (holdout.get("champion") or {}).get("accuracy")
        rows.append(f"| holdout accuracy | {holdout['challenger']['accuracy']:.4f} | "
                    f"{'-' if theirs is None else format(theirs, '.4f')} |")
    verdict = "promote" + (" (forced)" if decision.get("forced") else "")
    return "\n".join([
        f"The evaluation says **{verdict}** {evaluation['model_name']} "
        f"{evaluation['version']} on dataset `{evaluation.get('dataset', '?')}`:", "",
        *[f"- {reason}" for reason in decision["reasons"]], "", *rows, "",
        " · ".join(f"[{name}]({url})" for name, url in links.items()), "",
        "Approve: it goes to production. Reject: nothing moves. Either way, say why."])


class ApproveOperator(ApprovalOperator):
    """Asks a person before ``promote`` when the run requires it and the model won."""

    template_fields = ("evaluation", "published", "subject", "body")
    ui_color = "#ffe8cc"

    def __init__(self, *, evaluation: Any, published: Any, **kwargs: Any) -> None:
        # Nullable: on a timeout Airflow answers with the defaults, which must pass.
        # Only its own field: the DAG's params (the run's settings) are not asked again.
        kwargs["params"] = {"reason": Param(
            None, type=["null", "string"], title="Reason", source="task",
            description="Why you approve or reject (recorded in the promotion history).")}
        kwargs.setdefault("retries", 0)  # a retry would ask again
        # The wait is response_timeout, set per run in execute (not the DAG's default
        # execution_timeout, which would also bound the wait).
        kwargs.setdefault("execution_timeout", None)
        super().__init__(subject="Promote the new model?", defaults="Reject", **kwargs)
        self.evaluation, self.published = evaluation, published

    def _run(self, context: Any) -> tuple[Any, Any]:
        """The run's frozen config and the deployment's registry."""
        from airflow.sdk.exceptions import AirflowFailException

        from training.config import frozen
        from training.deployment import Deployment
        from training.errors import ConfigError
        from training_airflow.store import open_registry

        try:
            cfg = frozen.thaw(context["ti"].xcom_pull(task_ids=CONFIG_TASK, key="config"))
            deployment = Deployment.from_env()
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from exc
        return cfg, open_registry(cfg, deployment.aws_conn_id)

    def execute(self, context: Any) -> Any:
        cfg, registry = self._run(context)
        decision = self.evaluation["decision"]
        if not cfg.promotion.require_approval:
            return {"asked": False, "why": "promotion.require_approval is off"}
        if not decision["promote"]:
            return {"asked": False, "why": "the model lost: " + "; ".join(decision["reasons"])}
        from training.steps.evaluate import published_evaluation

        name, version = self.published["model_name"], self.published["version"]
        evaluation = published_evaluation(cfg, registry, version)
        self.subject = f"Promote {name} {version} to production?"
        self.body = request_body(evaluation, request_links(name, version))
        self.response_timeout = timedelta(minutes=cfg.promotion.approval_timeout_minutes)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        # On Reject, ApprovalOperator skips promote by raising (Airflow 3's
        # DownstreamTasksSkipped): the rejection is recorded before that.
        if "error" not in event and event.get("chosen_options") == [self.REJECT]:
            self._record_rejection(context, event)
        answer = super().execute_complete(context=context, event=event)
        return {"asked": True, "approved": answer["chosen_options"] == [self.APPROVE],
                "by": (answer.get("responded_by_user") or {}).get("name"),
                "reason": _reason(answer)}

    def _record_rejection(self, context: Any, event: dict[str, Any]) -> None:
        """A reviewer's Reject, or Airflow's on nobody's behalf when the time ran out:
        into the promotion history, and an alert."""
        from training_airflow import alerts

        reviewer = (event.get("responded_by_user") or {}).get("name")
        cfg, registry = self._run(context)
        name, version = self.published["model_name"], self.published["version"]
        dag_run = context["dag_run"]
        at, run = dag_run.run_after.isoformat(), {"dag_id": dag_run.dag_id,
                                                  "run_id": dag_run.run_id}
        links = request_links(name, version)
        if reviewer is None:  # Airflow answered Reject for nobody: the time ran out
            waited = timedelta(minutes=cfg.promotion.approval_timeout_minutes)
            registry.record_decision(
                name, version, action="timed out", run_id=cfg.run_id, at=at,
                reason=f"no answer within {cfg.promotion.approval_timeout_minutes} minutes")
            alerts.send(alerts.approval_timed_out(name, version, waited, links, **run))
        else:
            reason = _reason(event)
            registry.record_decision(name, version, action="rejected", run_id=cfg.run_id,
                                     at=at, reason=reason, by=reviewer)
            alerts.send(alerts.rejected(name, version, reviewer, reason, links, **run))


def _reason(answer: dict[str, Any]) -> str:
    return ((answer.get("params_input") or {}).get("reason") or "").strip() \
        or "no reason given"
