"""Who may use the Models page: a logged-in Airflow user whom the auth manager allows
the "Models" view.

Airflow does not put its login in front of plugin apps, so every route depends on
``require_viewer``: the UI's ``_token`` cookie or an ``Authorization: Bearer`` JWT,
validated by the configured auth manager. A browser that is not logged in is sent to
Airflow's login page (``login_redirect``); other clients get 401. ``caller_token`` is
the JWT the caller presented, which the promote form forwards to Airflow's REST API so
that Airflow's own permissions decide what the caller may trigger.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from models_view.parts.answers import Refused

RESOURCE_NAME = "Models"
TOKEN_COOKIE = "_token"  # the UI's JWT cookie (airflow's COOKIE_NAME_JWT_TOKEN)


class NotLoggedIn(Exception):
    """The request carries no valid Airflow token."""


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


def caller_token(request: Request) -> str | None:
    """The JWT the caller presented: the Bearer token if any (it wins, as in Airflow's
    own ``get_user``), else the UI's cookie."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.cookies.get(TOKEN_COOKIE) or None


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def login_redirect(request: Request, exc: NotLoggedIn) -> Response:
    """A browser's GET goes to Airflow's login page (which comes back here); 401 else."""
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
