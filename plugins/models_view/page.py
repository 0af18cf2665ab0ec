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

The HTML comes from ``training.report``'s template set (``models.html`` and
``refused.html`` beside the version report's templates): one layout, one stylesheet and
Jinja2's autoescape for every value shown.

The store is the deployment's (``TRAINING_STORE_URI``), opened through the library's
store code with the ``TRAINING_AWS_CONN_ID`` connection's credentials. Credentials are
never rendered: the page shows the store URI without any user info, and error texts
are scrubbed of the connection's secrets before they are shown.

Every request needs a logged-in Airflow user (the UI's ``_token`` cookie or a Bearer
JWT) whom the auth manager allows to see the "Models" view. A browser that is not
logged in is sent to Airflow's login page; other clients get 401.
"""

from __future__ import annotations

import logging
import mimetypes
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from training.errors import IntegrityError, RegistryError, TrainingError
from training.files import sha256_bytes
from training.layout import MODELS_PREFIX, REPORT_DIR, REPORT_INDEX, version_key
from training.report.render import render

log = logging.getLogger(__name__)

RESOURCE_NAME = "Models"
# A version's report page, relative to the version (``layout.version_key``).
REPORT_FILE = f"{REPORT_DIR}/{REPORT_INDEX}"
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
        from training.deployment import Deployment
        from training.registry import open_store
        from training.registry.versions import ModelRegistry
        from training_airflow.store import s3_options

        deployment = Deployment.from_env()
        key = (deployment.store.text, deployment.aws_conn_id)
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


def collect(registry: Any) -> list[dict[str, Any]]:
    """Every model with its production version, versions (newest first) and history."""
    keys = set(registry.store.list(MODELS_PREFIX))
    models = []
    for name in registry.list_models():
        versions = registry.list_versions(name)
        for entry in versions:
            entry["has_report"] = version_key(name, entry["version"], REPORT_FILE) in keys
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


def render_index(models: Sequence[dict], store_uri: str) -> str:
    """The page: ``models`` as ``collect`` returns them, the store URI without user info.
    The HTML is the ``models.html`` template of ``training.report``'s template set."""
    return render("models.html", title="Models", models=models,
                  store_uri=display_uri(store_uri), report_file=REPORT_FILE)


# --------------------------------------------------------------------------- app


def _refuse_page(exc: Refused) -> HTMLResponse:
    return HTMLResponse(render("refused.html", title=exc.title, detail=exc.detail),
                        status_code=exc.status)


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
        rel = f"{REPORT_DIR}/{path}"
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
            data = registry.store.get_bytes(version_key(name, version, rel))
        except Refused:
            raise
        except Exception as exc:
            raise _store_failure(exc) from None
        if sha256_bytes(data) != entry.get("sha256"):
            raise Refused(502, "Corrupt report file",
                          f"{rel!r} of model {name!r} version {version!r} does not match the "
                          "SHA-256 its manifest records")
        media_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
        if media_type.startswith("text/"):
            media_type += "; charset=utf-8"
        return Response(data, media_type=media_type,
                        headers={"Cache-Control": "private, max-age=300"})

    return app
