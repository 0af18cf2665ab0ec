"""How the Models page answers: its Content-Security-Policy and its HTML pages, a
refused request's one-line page included.

No script runs on these pages, reports included: they are served from Airflow's
origin, where a script could call Airflow's API with the user's cookie. Forms may only
be sent to this origin, and only from the pages that hold one (the Models page's compare
form, the promote form); every other answer, a version's report included, may send no
form at all.
"""

from __future__ import annotations

from fastapi.responses import HTMLResponse

from training.report.render import render

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "font-src 'self' data:; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)
# The pages with a form: the same, but their forms may be sent to this origin.
CONTENT_SECURITY_POLICY_WITH_FORMS = CONTENT_SECURITY_POLICY.replace(
    "form-action 'none'", "form-action 'self'")


class Refused(Exception):
    """An HTTP error to answer with an HTML page."""

    def __init__(self, status: int, title: str, detail: str):
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


def page(template: str, *, status: int = 200, forms: bool = False, **context: object
         ) -> HTMLResponse:
    """``template`` of ``training.report``'s template set as an HTML answer; ``forms``:
    the page holds a form, so its CSP lets forms be sent to this origin."""
    headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY_WITH_FORMS} if forms else None
    return HTMLResponse(render(template, **context), status_code=status, headers=headers)


def refused_page(exc: Refused) -> HTMLResponse:
    """The one-line page of a refused request: its status, title and why."""
    return page("refused.html", status=exc.status, title=exc.title, detail=exc.detail)
