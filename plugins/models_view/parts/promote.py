"""The promote form: ``GET /models/<name>/versions/<version>/promote?action=promote|rollback``
shows it, prefilled, and a ``POST`` to the same URL triggers the ``promote_model`` DAG.

The page does not move the production pointer itself: it triggers the DAG through
Airflow's public REST API (``POST <api base>/api/v2/dags/promote_model/dagRuns``) with the
caller's own JWT, so Airflow's permissions decide who may, the run records who did, and
the DAG checks the version before it moves anything. The api base is ``[api] base_url``
(else ``http://127.0.0.1:<[api] port>``): the same api-server. The answer is a 303 to the
new run's page in the UI; a 403 from Airflow is shown as "you may not trigger
promote_model".

The form carries a token against cross-site requests: HMAC-SHA256, keyed by Airflow's
``[api] secret_key``, over the user, the model, the version and the action. A POST
without the right one is refused (403) before anything else; a POST with an empty reason
gets the form back (400) and triggers nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from models_view.parts import stores
from models_view.parts.access import Viewer, caller_token
from models_view.parts.answers import Refused, page
from models_view.parts.stores import store_failure
from training.errors import RegistryError, TrainingError

router = APIRouter()

DAG_ID = "promote_model"
ACTIONS = {"promote": "Promote", "rollback": "Roll back"}
TRIGGER_TIMEOUT_S = 10.0
MAX_FORM_BYTES = 16 * 1024
# From /models/<name>/versions/<version>/promote, the UI's root is four levels up.
UI_ROOT = "../../../../"


def form_token(secret: str, user_id: str, name: str, version: str, action: str) -> str:
    """The form's token against cross-site requests, for this user and this change."""
    message = json.dumps([user_id, name, version, action]).encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _secret() -> str:
    from airflow.configuration import conf

    secret = conf.get("api", "secret_key", fallback="") or ""
    if not secret:
        raise Refused(500, "Not configured", "[api] secret_key is not set: the promote form "
                      "cannot be protected against cross-site requests without it")
    return secret


def api_base() -> str:
    """Where Airflow's REST API is: ``[api] base_url``, else this host's ``[api] port``."""
    from airflow.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    if base.startswith(("http://", "https://")):
        return base
    return f"http://127.0.0.1:{conf.getint('api', 'port', fallback=8080)}"


def check_request(name: str, version: str, action: str | None) -> None:
    """Refused (404/400) for a name, version or action the form cannot be for."""
    from training.layout import validate_name

    try:
        validate_name("model name", name)
        validate_name("version", version)
    except TrainingError as exc:
        raise Refused(404, "Not found", str(exc)) from None
    if action not in ACTIONS:
        raise Refused(400, "Bad request",
                      f"action must be 'promote' or 'rollback', got {action!r}")


def read_version(name: str, version: str) -> tuple[dict[str, Any], str | None]:
    """The version's manifest and the version in production; Refused 404 for a version
    that does not exist, 400 for the one in production."""
    try:
        registry = stores.STORES.get()
        try:
            manifest = registry.show(name, version)
        except RegistryError as exc:
            raise Refused(404, "Not found", f"version: {exc}") from None
        production = registry.production(name)
    except Refused:
        raise
    except Exception as exc:
        raise store_failure(exc) from None
    if production == version:
        raise Refused(400, "Bad request", f"version {version!r} of model {name!r} is already "
                      "in production: there is nothing to promote or roll back")
    return manifest, production


def _form(user: Any, name: str, version: str, action: str, *, reason: str = "",
          error: str | None = None, status: int = 200) -> Response:
    manifest, production = read_version(name, version)
    to = "to " if action == "rollback" else ""
    return page("promote.html", status=status, forms=True,
                title=f"{ACTIONS[action]} {name} {to}version {version}", name=name,
                version=version, action=action, verb=ACTIONS[action], production=production,
                created=manifest.get("created"), metrics=manifest.get("metrics") or {},
                token=form_token(_secret(), str(user.get_id()), name, version, action),
                reason=reason, error=error)


@router.get("/{name}/versions/{version}/promote")
def promote_form(name: str, version: str, user: Viewer, action: str | None = None):
    check_request(name, version, action)
    return _form(user, name, version, action)


async def _trigger(token: str, user: Any, conf: dict[str, str]) -> str:
    """Trigger the DAG as the caller; the new run's id, or Refused with what Airflow said."""
    import httpx

    url = f"{api_base()}/api/v2/dags/{DAG_ID}/dagRuns"
    try:
        async with httpx.AsyncClient(timeout=TRIGGER_TIMEOUT_S) as client:
            answer = await client.post(url, json={"logical_date": None, "conf": conf},
                                       headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as exc:
        raise Refused(502, "Cannot trigger", f"cannot reach Airflow's API at {url} to trigger "
                      f"{DAG_ID}: {type(exc).__name__}: {exc}") from None
    if answer.status_code in (200, 201):
        return str(answer.json()["dag_run_id"])
    try:
        said = answer.json()
        detail = said.get("detail") if isinstance(said, dict) else said
    except ValueError:
        detail = answer.text[:300]
    if answer.status_code == 403:
        raise Refused(403, "Forbidden", f"you may not trigger {DAG_ID}: Airflow refused it "
                      f"for your user {user.get_name()!r} ({detail})")
    if answer.status_code == 401:
        raise Refused(401, "Not logged in", f"Airflow did not accept your login to trigger "
                      f"{DAG_ID} ({detail}): sign in again")
    raise Refused(502, "Cannot trigger", f"Airflow answered HTTP {answer.status_code} to "
                  f"triggering {DAG_ID} at {url}: {detail}")


@router.post("/{name}/versions/{version}/promote")
async def promote(name: str, version: str, request: Request, user: Viewer) -> Response:
    from starlette.concurrency import run_in_threadpool

    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise Refused(413, "Too large", f"the form is {len(body)} bytes, over {MAX_FORM_BYTES}")
    form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"),
                                         keep_blank_values=True).items()}
    action = form.get("action")
    check_request(name, version, action)
    expected = form_token(_secret(), str(user.get_id()), name, version, action)
    if not hmac.compare_digest(form.get("token", "").encode(), expected.encode()):
        raise Refused(403, "Forbidden", "token: the form's token is missing or wrong for "
                      f"your user, {name!r}, {version!r} and {action!r}; open the form again")
    for field, value in (("model", name), ("version", version)):
        if form.get(field, value) != value:
            raise Refused(400, "Bad request", f"{field} must be {value!r} (the form's URL), "
                          f"got {form[field]!r}")
    reason = form.get("reason", "").strip()
    if not reason:
        return await run_in_threadpool(
            _form, user, name, version, action, status=400,
            error="reason is required: say why (it goes into the promotion history); got an "
                  "empty reason, nothing was triggered")
    await run_in_threadpool(read_version, name, version)
    token = caller_token(request)
    if not token:
        raise Refused(401, "Not logged in", "no Airflow token to trigger the DAG with: sign in")
    run_id = await _trigger(token, user, {"model_name": name, "version": version,
                                          "action": action, "reason": reason})
    return RedirectResponse(f"{UI_ROOT}dags/{DAG_ID}/runs/{quote(run_id, safe='')}",
                            status_code=303)
