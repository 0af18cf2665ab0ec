"""Airflow plugin: a "Models" page in the Airflow UI.

Two pieces, both through Airflow 3's plugin interface:

- ``fastapi_apps``: a small FastAPI app that the api-server mounts at ``/models``. It
  renders every model of the deployment's store (``TRAINING_STORE_URI``, read with the
  ``TRAINING_AWS_CONN_ID`` connection's credentials): the version in production, a plot
  of each version's accuracy, the versions newest first with their key metrics and
  dataset, the promotion history, each version's report
  (``models/<name>/versions/<version>/report/``), two versions' settings side by side,
  and a form per version that triggers the ``promote_model`` DAG (promote or roll back)
  through Airflow's REST API as the user: the page itself never writes to the store.
- ``external_views``: a "Models" entry in the UI's navigation that shows that app in the
  UI's frame (``/plugin/models``).

Airflow does not put its login in front of plugin apps, so the app checks the caller
itself: the UI's ``_token`` cookie or an ``Authorization: Bearer`` JWT, validated by the
configured auth manager, which must also allow the user to see the "Models" view.

Every process that loads plugins (task runners included) imports this module, so the
FastAPI app is built on the first request, in the api-server only: nothing heavy is
imported here. Airflow loads each ``.py`` file of the plugins folder as a top-level
module, so this file uses absolute imports, and the app's modules (``page.py``,
``parts/``) are listed in ``.airflowignore`` files.
"""

from __future__ import annotations

import threading
from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/models"


class LazyModelsApp:
    """An ASGI app that builds ``models_view.page.create_app()`` on its first call."""

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    from models_view.page import create_app

                    self._app = create_app()
        return self._app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._get()(scope, receive, send)


def _page_href() -> str:
    """Where the UI's frame finds the page: under ``[api] base_url``'s path, if any."""
    from urllib.parse import urlsplit

    from airflow.configuration import conf

    root = urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    return f"{root}{URL_PREFIX}/"


app = LazyModelsApp()


class ModelsViewPlugin(AirflowPlugin):
    name = "models_view"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Models"}]
    external_views = [
        {
            "name": "Models",
            "href": _page_href(),
            "destination": "nav",
            "url_route": "models",
            "nav_top_level": True,
        }
    ]
