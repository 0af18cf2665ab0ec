"""The model registry mirrored in MLflow's: versions registered, ``champion`` on production.

The project's registry stays the truth (``production.json``, the checksummed versions);
MLflow's registered model ``<name>`` mirrors it so that teams load
``models:/<name>@champion``:

- ``_registered``: a published version becomes a model version whose source is the
  version's folder in the store (an MLflow model itself: ``mlmodel.py``), tagged
  ``pipeline.version``; registering it again finds it (idempotent);
- ``_pointer_moved``: every move of the pointer (``ProductionPointer._moved``: the
  pipeline, the Models page, the CLI, a rollback) moves the ``champion`` alias, after
  registering the version if it was not;
- ``_sync``: every complete version of every model registered, and ``champion`` set
  from ``production.json``: ``python -m training models sync-mlflow`` repairs what a
  server that was down missed.

A mirror call that fails is retried once; then it warns (the task log) and gives up,
and the promotion it followed stands (``MlflowTracker._safely``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from training.layout import version_prefix

log = logging.getLogger("training")

VERSION_TAG = "pipeline.version"
CHAMPION = "champion"


class RegistryMirror:
    """The registry half of ``MlflowTracker`` (its ``client``, ``_safely``)."""

    client: Any

    def _retried(self, what: str, call: Any) -> Any:
        def twice() -> Any:
            try:
                return call()
            except Exception:  # noqa: BLE001 - one more try, then _safely warns
                time.sleep(1)
                return call()
        return self._safely(what, twice)  # type: ignore[attr-defined]

    def _model_version(self, name: str, version: str, source: str,
                       run_id: str | None) -> str:
        with contextlib.suppress(Exception):  # it exists (a real failure shows below)
            self.client.create_registered_model(name)
        for found in self.client.search_model_versions(f"name = '{name}'"):
            if (found.tags or {}).get(VERSION_TAG) == version:
                return found.version
        return self.client.create_model_version(
            name, source, run_id=run_id, tags={VERSION_TAG: version},
            description=f"version {version} of the pipeline's registry").version

    def _registered(self, name: str, version: str, store_uri: str,
                    run_id: str | None = None) -> str | None:
        """The MLflow model version of ``version`` (registered now if it was not), or
        None when tracking has stopped. ``run_id``: the pipeline run that made it."""
        source = f"{store_uri.rstrip('/')}/{version_prefix(name, version)}".rstrip("/")
        mlflow_run = self.run_of(name, run_id) if run_id else None  # type: ignore[attr-defined]
        return self._retried(f"registering {name} version {version}",
                             lambda: self._model_version(name, version, source, mlflow_run))

    def _pointer_moved(self, name: str, pointer: dict[str, Any], store_uri: str) -> None:
        """``champion`` on the pointer's version."""
        version = pointer.get("version")
        if version is None:
            return
        number = self._registered(name, version, store_uri)
        if number is not None:
            self._retried(f"moving {name}@{CHAMPION}", lambda: self.client.
                          set_registered_model_alias(name, CHAMPION, number))
            log.info("MLflow: %s@%s is version %s (%s)", name, CHAMPION, number, version)

    def _sync(self, registry: Any) -> dict[str, Any]:
        """Every complete version registered and every ``champion`` set from the store;
        what was done."""
        done: dict[str, Any] = {}
        store_uri = registry.store.uri
        for name in registry.list_models():
            versions = [v["version"] for v in reversed(registry.list_versions(name))]
            numbers = {v: self._registered(name, v, store_uri) for v in versions}
            production = registry.production(name)
            if production is not None and numbers.get(production) is not None:
                number = numbers[production]
                self._retried(f"moving {name}@{CHAMPION}", lambda n=name, v=number:
                              self.client.set_registered_model_alias(n, CHAMPION, v))
            done[name] = {"versions": numbers, CHAMPION: production}
        if self.stopped:  # type: ignore[attr-defined]
            done["error"] = self.stopped  # type: ignore[attr-defined]
        return done
