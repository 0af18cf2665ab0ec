"""The Models page: a read-only FastAPI app over the model registry.

Mounted by the api-server at ``/models`` (see ``models_view/__init__.py``):

- ``GET /models/``: every model, the version in production, its versions most recently
  published first with their key metrics, publication and run times, the Airflow run
  that produced each (linked to that run in the UI), a link to each version's report,
  and the promotion history. Each version's row is the anchor ``#<model>/<version>``
  (the target of the DAG tasks' "Model version" extra link) and is highlighted when
  targeted;
- ``GET /models/<name>/versions/<version>/report/<path>``: one file of a version's
  report (``index.html`` and the images beside it), streamed from the store. Only files
  that the version's manifest lists under ``report/`` are served, and their SHA-256 is
  checked against the manifest.

The store is the deployment's (``TRAINING_STORE_URI``), opened through the library's
store code with the ``TRAINING_AWS_CONN_ID`` connection's credentials. Credentials are
never rendered: the page shows the store URI without any user info, and error texts
are scrubbed of the connection's secrets before they are shown.

Every request needs a logged-in Airflow user (the UI's ``_token`` cookie or a Bearer
JWT) whom the auth manager allows to see the "Models" view. A browser that is not
logged in is sent to Airflow's login page; other clients get 401.
"""

from __future__ import annotations

import hashlib
import html
import logging
import mimetypes
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Annotated, Any
from urllib.parse import quote, urlsplit, urlunsplit

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from training.errors import IntegrityError, RegistryError, TrainingError

log = logging.getLogger(__name__)

RESOURCE_NAME = "Models"
KEY_METRICS = ("accuracy", "loss", "macro_f1")
REPORT_INDEX = "index.html"
STORE_CACHE_S = 60.0
# No script runs on these pages, reports included: they are served from Airflow's
# origin, where a script could call Airflow's API with the user's cookie.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "font-src 'self' data:; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)


class NotLoggedIn(Exception):
    """The request carries no valid Airflow token."""


class Refused(Exception):
    """An HTTP error to answer with an HTML page."""

    def __init__(self, status: int, title: str, detail: str):
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


# --------------------------------------------------------------------------- auth

_bearer = HTTPBearer(auto_error=False)


async def require_viewer(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Any:
    """The Airflow user of the request, checked by the configured auth manager."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import HTTPException

    try:
        user = await get_user(request=request, _oauth_token=None, bearer_credentials=bearer)
    except HTTPException as exc:
        if exc.status_code in (401, 403):
            raise NotLoggedIn(str(exc.detail)) from None
        raise
    allowed = get_auth_manager().is_authorized_custom_view(
        method="GET", resource_name=RESOURCE_NAME, user=user
    )
    if not allowed:
        raise Refused(403, "Forbidden", "Your Airflow user may not see the Models view.")
    return user


Viewer = Annotated[Any, Depends(require_viewer)]


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def _login_redirect(request: Request, exc: NotLoggedIn) -> Response:
    if request.method != "GET" or not _wants_html(request):
        return JSONResponse(
            {"detail": f"Not authenticated: {exc}"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import is_safe_url

    here = str(request.url)
    login = get_auth_manager().get_url_login(next_url=here if is_safe_url(here, request) else None)
    return RedirectResponse(login, status_code=303)


# --------------------------------------------------------------------------- store


class _StoreCache:
    """The registry on the deployment's store, reopened every STORE_CACHE_S seconds.

    ``secrets`` holds the connection's keys as soon as they are read, so that any text
    shown afterwards (an error from opening or reading the store included) is scrubbed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entry: tuple[tuple[str, str], float, Any] | None = None
        self.secrets: frozenset[str] = frozenset()

    def get(self) -> Any:
        from training.registry.store import open_store
        from training.registry.versions import ModelRegistry
        from training_airflow.params import aws_conn_id, deployment_settings
        from training_airflow.store import s3_options

        key = (deployment_settings()["store_uri"], aws_conn_id())
        with self._lock:
            entry = self._entry
            if entry is None or entry[0] != key or time.monotonic() - entry[1] > STORE_CACHE_S:
                self._entry = None
                options = s3_options(*key)
                if options is not None:
                    keys = (options.aws_access_key_id, options.aws_secret_access_key,
                            options.aws_session_token)
                    self.secrets = self.secrets | {k for k in keys if k}
                entry = self._entry = (key, time.monotonic(),
                                       ModelRegistry(open_store(key[0], options)))
        return entry[2]


_stores = _StoreCache()


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def display_uri(uri: str) -> str:
    """The store URI without any user info (``scheme://user:pass@host`` loses ``user:pass@``)."""
    parts = urlsplit(uri)
    if parts.netloc and "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return uri


def version_prefix(name: str, version: str) -> str:
    return f"models/{name}/versions/{version}/"


def collect(registry: Any) -> list[dict[str, Any]]:
    """Every model with its production version, versions (newest first) and history."""
    keys = set(registry.store.list("models/"))
    models = []
    for name in registry.list_models():
        versions = registry.list_versions(name)
        for entry in versions:
            report = version_prefix(name, entry["version"]) + f"report/{REPORT_INDEX}"
            entry["has_report"] = report in keys
        try:
            production, history, problem = registry.production(name), registry.history(name), None
        except IntegrityError as exc:  # one damaged pointer must not hide every model
            production, history, problem = None, [], str(exc)
        models.append({
            "name": name,
            "production": production,
            "versions": versions,
            "history": history,
            "problem": problem,
        })
    return models


# --------------------------------------------------------------------------- HTML

STYLE = """
:root { color-scheme: light dark; --fg: #1a202c; --muted: #4a5568; --line: #e2e8f0;
  --head: #f7fafc; --prod: #276749; --prod-bg: #c6f6d5; --link: #2b6cb0; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e2e8f0; --muted: #a0aec0; --line: #2d3748; --head: #1a202c;
    --prod: #c6f6d5; --prod-bg: #22543d; --link: #90cdf4; } }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); margin: 1.25rem 1.5rem; }
h1 { font-size: 1.5rem; margin: 0 0 .25rem; }
h2 { font-size: 1.2rem; margin: 2rem 0 .5rem; }
h3 { font-size: 1rem; margin: 1.25rem 0 .4rem; color: var(--muted); }
.meta { color: var(--muted); margin: 0 0 1rem; }
table { border-collapse: collapse; min-width: 40rem; }
th, td { border-bottom: 1px solid var(--line); padding: .35rem .75rem; text-align: left;
  vertical-align: top; }
th { background: var(--head); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
a { color: var(--link); }
.badge { display: inline-block; padding: 0 .5rem; border-radius: .75rem; font-size: 12px;
  font-weight: 600; color: var(--prod); background: var(--prod-bg); }
tr.production td { background: color-mix(in srgb, var(--prod-bg) 35%, transparent); }
tr.version:target td { background: color-mix(in srgb, var(--link) 18%, transparent); }
tr.version:target td:first-child { box-shadow: inset 4px 0 0 var(--link); }
.none { color: var(--muted); font-style: italic; }
nav.models a { margin-right: .75rem; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _metric(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return '<span class="none">&mdash;</span>'
    if isinstance(value, (int, float)):
        return f"{value:.4f}"
    return _e(value)


def page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def airflow_run_cell(entry: dict) -> str:
    """The Airflow run that produced a version, linked to it in the UI (relative to
    ``/models/``, so it works under any ``base_url`` path); the run id otherwise."""
    source = entry.get("source") or {}
    dag_id, run_id = source.get("dag_id"), source.get("run_id")
    if not (dag_id and run_id):
        return f'<code>{_e(entry["run_id"])}</code>'
    href = f"../dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
    return (f'<a class="airflow-run" href="{_e(href)}" target="_top">'
            f"<code>{_e(run_id)}</code></a>")


def render_versions(name: str, production: str | None, versions: Sequence[dict]) -> str:
    head = "".join(f'<th class="num">{_e(m)}</th>' for m in KEY_METRICS)
    rows = []
    for entry in versions:
        version = entry["version"]
        in_production = version == production
        status = '<span class="badge">production</span>' if in_production else ""
        if entry.get("has_report"):
            href = f"{quote(name)}/versions/{quote(version)}/report/{REPORT_INDEX}"
            report = f'<a class="report" href="{_e(href)}">report</a>'
        else:
            report = '<span class="none">no report</span>'
        metrics = entry.get("metrics") or {}
        cells = "".join(f'<td class="num">{_metric(metrics.get(m))}</td>' for m in KEY_METRICS)
        published = entry.get("published") or entry["created"]
        rows.append(
            f'<tr class="version{" production" if in_production else ""}" '
            f'id="{_e(name)}/{_e(version)}" data-version="{_e(version)}">'
            f"<td><code>{_e(version)}</code> {status}</td>"
            f"{cells}<td>{_e(published)}</td><td>{_e(entry['created'])}</td>"
            f"<td>{airflow_run_cell(entry)}</td><td>{report}</td></tr>"
        )
    return (
        f'<table class="versions"><thead><tr><th>version</th>{head}<th>published</th>'
        f"<th>run started</th><th>Airflow run</th><th>report</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def render_history(history: Sequence[dict]) -> str:
    if not history:
        return '<p class="none history">No promotions yet.</p>'
    rows = []
    for record in reversed(history):
        before = record.get("from")
        before_html = f"<code>{_e(before)}</code>" if before else '<span class="none">none</span>'
        forced = " (forced)" if record.get("forced") else ""
        rows.append(
            f"<tr><td>{_e(record.get('at', ''))}</td><td>{before_html} &rarr; "
            f"<code>{_e(record.get('to', ''))}</code>{forced}</td>"
            f"<td>{_e(record.get('reason', ''))}</td>"
            f"<td><code>{_e(record.get('run_id', ''))}</code></td></tr>"
        )
    return (
        '<table class="history"><thead><tr><th>at</th><th>change</th><th>reason</th>'
        f"<th>run id</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render_index(models: Sequence[dict], store_uri: str) -> str:
    parts = [
        "<h1>Models</h1>",
        f'<p class="meta">Read-only view of the model store <code>{_e(display_uri(store_uri))}'
        "</code>. Versions are listed most recently published first.</p>",
    ]
    if not models:
        parts.append('<p class="none">No published model in this store yet.</p>')
    else:
        links = " ".join(
            f'<a href="#model-{_e(m["name"])}">{_e(m["name"])}</a>' for m in models
        )
        parts.append(f'<nav class="models">{links}</nav>')
    for model in models:
        name, production = model["name"], model["production"]
        if model.get("problem"):
            problem = _e(model["problem"])
            where = f'<span class="none">production pointer unreadable: {problem}</span>'
        elif production:
            where = f'in production: <code>{_e(production)}</code>'
        else:
            where = '<span class="none">nothing in production</span>'
        count = len(model["versions"])
        parts.append(
            f'<section class="model" id="model-{_e(name)}" data-model="{_e(name)}">'
            f"<h2>{_e(name)}</h2>"
            f'<p class="meta production">{where} &middot; {count} '
            f"version{'s' if count != 1 else ''}</p>"
            + render_versions(name, production, model["versions"])
            + "<h3>Promotion history (newest first)</h3>"
            + render_history(model["history"])
            + "</section>"
        )
    return page("Models", "\n".join(parts))


# --------------------------------------------------------------------------- app


def _refuse_page(exc: Refused) -> HTMLResponse:
    body = f"<h1>{_e(exc.title)}</h1><p>{_e(exc.detail)}</p>"
    return HTMLResponse(page(exc.title, body), status_code=exc.status)


def _store_failure(exc: Exception) -> Refused:
    text = scrub(f"{type(exc).__name__}: {exc}", _stores.secrets)
    log.warning("Models page cannot read the model store: %s", text)
    return Refused(502, "Model store unavailable", f"Cannot read the model store: {text}")


def create_app() -> FastAPI:
    app = FastAPI(title="Models", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    app.add_exception_handler(NotLoggedIn, _login_redirect)
    app.add_exception_handler(Refused, lambda request, exc: _refuse_page(exc))

    @app.get("/", response_class=HTMLResponse)
    def index(user: Viewer) -> HTMLResponse:
        try:
            registry = _stores.get()
            models = collect(registry)
        except Exception as exc:
            raise _store_failure(exc) from None
        return HTMLResponse(render_index(models, registry.store.uri))

    @app.get("/{name}/versions/{version}/report/{path:path}")
    def report_file(name: str, version: str, path: str, user: Viewer) -> Response:
        from training.layout import validate_name
        from training.registry.store import check_key

        if path == "":
            return RedirectResponse(REPORT_INDEX, status_code=307)
        rel = f"report/{path}"
        try:
            validate_name("model name", name)
            validate_name("version", version)
            check_key(rel)
        except TrainingError as exc:
            raise Refused(404, "Not found", str(exc)) from None
        try:
            registry = _stores.get()
            try:
                manifest = registry.show(name, version)
            except RegistryError as exc:
                raise Refused(404, "Not found", str(exc)) from None
            entry = next((f for f in manifest.get("files", []) if f.get("path") == rel), None)
            if entry is None:
                what = "a report" if path == REPORT_INDEX else f"a report file {path!r}"
                raise Refused(404, "Not found",
                              f"model {name!r} version {version!r} has no {what}")
            data = registry.store.get_bytes(version_prefix(name, version) + rel)
        except Refused:
            raise
        except Exception as exc:
            raise _store_failure(exc) from None
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise Refused(502, "Corrupt report file",
                          f"{rel!r} of model {name!r} version {version!r} does not match the "
                          "SHA-256 its manifest records")
        media_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
        if media_type.startswith("text/"):
            media_type += "; charset=utf-8"
        return Response(data, media_type=media_type,
                        headers={"Cache-Control": "private, max-age=300"})

    return app
