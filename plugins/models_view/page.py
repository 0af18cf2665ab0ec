"""The Models page: a FastAPI app over the model registry.

Mounted by the api-server at ``/models`` (see ``models_view/__init__.py``):

- ``GET /models/``: every model, the version in production, a plot of each version's
  test (and holdout) accuracy in publish order with production marked, its versions most
  recently published first with their key metrics, dataset, publication and run times,
  the Airflow run that produced each (linked to that run in the UI), a link to each
  version's report, a link to promote or roll back to it, a form to compare two
  versions' settings, and the promotion history. Each version's row is the anchor
  ``#<model>/<version>`` (the target of the DAG tasks' "Model version" extra link) and
  is highlighted when targeted;
- ``GET /models/<name>/versions/<version>/report/<path>``: one file of a version's
  report (``index.html`` and the images beside it), streamed from the store. Only files
  that the version's manifest lists under ``report/`` are served, and their SHA-256 is
  checked against the manifest;
- ``GET /models/<name>/compare?a=&b=``: two versions' settings side by side
  (``parts/compare.py``);
- ``GET`` and ``POST /models/<name>/versions/<version>/promote``: the form that triggers
  the ``promote_model`` DAG as the caller (``parts/promote.py``). It is the only route
  that changes anything, and only through Airflow's own REST API.

The HTML comes from ``training.report``'s template set (``models.html``, ``compare.html``,
``promote.html`` and ``refused.html`` beside the version report's templates): one
layout, one stylesheet and Jinja2's autoescape for every value shown.

The store is the deployment's (``TRAINING_STORE_URI``), opened through the library's
store code with the ``TRAINING_AWS_CONN_ID`` connection's credentials (``parts/stores.py``).
Credentials are never rendered: the page shows the store URI without any user info, and
error texts are scrubbed of the connection's secrets before they are shown.

Every request needs a logged-in Airflow user (the UI's ``_token`` cookie or a Bearer
JWT) whom the auth manager allows to see the "Models" view (``parts/access.py``).
"""

from __future__ import annotations

import mimetypes
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from models_view.parts import compare, promote, stores
from models_view.parts.access import NotLoggedIn, Viewer, login_redirect, require_viewer
from models_view.parts.answers import (
    CONTENT_SECURITY_POLICY,
    CONTENT_SECURITY_POLICY_WITH_FORMS,
    Refused,
    refused_page,
)
from models_view.parts.listing import REPORT_FILE, collect
from models_view.parts.stores import display_uri, store_failure
from training.errors import RegistryError, TrainingError
from training.files import sha256_bytes
from training.layout import REPORT_DIR, REPORT_INDEX, version_key
from training.report.render import render

__all__ = ["create_app", "render_index", "require_viewer"]


def render_index(models: Sequence[dict], store_uri: str) -> str:
    """The page: ``models`` as ``parts.listing.collect`` returns them, the store URI
    without user info. The HTML is the ``models.html`` template of ``training.report``'s
    template set."""
    return render("models.html", title="Models", models=models,
                  store_uri=display_uri(store_uri), report_file=REPORT_FILE)


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

    app.add_exception_handler(NotLoggedIn, login_redirect)
    app.add_exception_handler(Refused, lambda request, exc: refused_page(exc))

    @app.get("/", response_class=HTMLResponse)
    def index(user: Viewer) -> HTMLResponse:
        try:
            registry = stores.STORES.get()
            models = collect(registry)
        except Exception as exc:
            raise store_failure(exc) from None
        return HTMLResponse(render_index(models, registry.store.uri),
                            headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY_WITH_FORMS})

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
            registry = stores.STORES.get()
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
            raise store_failure(exc) from None
        if sha256_bytes(data) != entry.get("sha256"):
            raise Refused(502, "Corrupt report file",
                          f"{rel!r} of model {name!r} version {version!r} does not match the "
                          "SHA-256 its manifest records")
        media_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
        if media_type.startswith("text/"):
            media_type += "; charset=utf-8"
        return Response(data, media_type=media_type,
                        headers={"Cache-Control": "private, max-age=300"})

    app.include_router(compare.router)
    app.include_router(promote.router)
    return app
