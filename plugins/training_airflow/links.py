"""The "Model version" extra link of the model steps, and where it points.

The link opens the version on the Models page (``/models/#<model>/<version>`` under the
path of ``[api] base_url``, so it opens on whatever host the UI was reached by), from
which the page links back to the Airflow run. A step pushes the version it works on as
XCom ``model_version`` before it does anything, so the link exists even when the step
fails or is skipped; Airflow 3 computes extra links in the task process when the task
ends and stores them as XCom, so the api-server runs none of this code.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

VERSION_XCOM = "model_version"


def models_page_url(model_name: str, version: str) -> str:
    """The version's row on the Models page, under the path of ``[api] base_url``."""
    from airflow.configuration import conf

    root = urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    return f"{root}/models/#{quote(model_name)}/{quote(version)}"


class ModelVersionLink(BaseOperatorLink):
    """Extra link from a step to the model version it evaluated, published or promoted."""

    name = "Model version"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        # When a task ends, the task runner passes its own task instance here.
        pull = getattr(ti_key, "xcom_pull", None)
        found = pull(task_ids=ti_key.task_id, key=VERSION_XCOM) if pull else None
        if not isinstance(found, dict):
            return ""
        return models_page_url(found["model_name"], found["version"])
