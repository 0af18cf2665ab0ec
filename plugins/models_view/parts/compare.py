"""Two versions' effective settings side by side: ``GET /models/<name>/compare?a=&b=``.

Each version publishes the effective config of its run (``config.json``, written before
training: ``training.layout.CONFIG``). The page reads both (checked against the
versions' manifests, cached like every published JSON file) and shows every setting as
``section.field`` with both values, the rows that differ highlighted, in the order of
version ``a``'s config then the settings only ``b`` has. A value is shown as the
version report shows it (``cell`` filter). Bad input is refused with a one-line page
that names the field, the value and what is allowed: 400 for a missing ``a`` or ``b``,
404 for an unknown model or version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter

from models_view.parts import stores
from models_view.parts.access import Viewer
from models_view.parts.answers import Refused, page
from models_view.parts.stores import JSON_FILES, store_failure
from training.errors import TrainingError
from training.layout import CONFIG, version_key

router = APIRouter()
_MISSING = object()


def flat_settings(config: Any) -> dict[str, Any]:
    """``{"section.field": value}`` of a config (sections of fields, as ``config.json``
    holds it); a top-level value that is not a section keeps its own name."""
    settings: dict[str, Any] = {}
    for section, fields in (config.items() if isinstance(config, Mapping) else ()):
        if isinstance(fields, Mapping):
            settings.update((f"{section}.{field}", value) for field, value in fields.items())
        else:
            settings[section] = fields
    return settings


def compare_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per setting of either: its name, both values (``None`` where a version
    has no such setting, with ``a_set``/``b_set`` False) and whether they differ."""
    names = [*a, *(n for n in b if n not in a)]
    rows = []
    for name in names:
        va, vb = a.get(name, _MISSING), b.get(name, _MISSING)
        rows.append({"setting": name,
                     "a": None if va is _MISSING else va, "a_set": va is not _MISSING,
                     "b": None if vb is _MISSING else vb, "b_set": vb is not _MISSING,
                     "differs": va is _MISSING or vb is _MISSING or va != vb})
    return rows


def read_config(registry: Any, name: str, version: str) -> dict[str, Any] | None:
    """The published config of a complete ``version`` (None if it published none)."""
    manifest = registry.show(name, version)
    entry = next((f for f in manifest.get("files", []) if f.get("path") == CONFIG), None)
    if entry is None:
        return None
    config = JSON_FILES.read(registry, version_key(name, version, CONFIG),
                             (manifest.get("created"), manifest.get("run_id")),
                             sha256=entry.get("sha256"))
    return config if isinstance(config, dict) else None


def check_pick(name: str, field: str, value: str | None, versions: list[str]) -> str:
    """``value`` if it names one of ``versions``; else Refused naming ``field``."""
    allowed = f"one of the versions of model {name!r}: {', '.join(versions)}"
    if not value:
        raise Refused(400, "Bad request",
                      f"{field} is missing: compare?a=<version>&b=<version> takes {allowed}")
    if value not in versions:
        raise Refused(404, "Not found", f"{field}={value!r} is not {allowed}")
    return value


@router.get("/{name}/compare")
def compare(name: str, user: Viewer, a: str | None = None, b: str | None = None):
    from training.layout import validate_name

    try:
        validate_name("model name", name)
    except TrainingError as exc:
        raise Refused(404, "Not found", str(exc)) from None
    try:
        registry = stores.STORES.get()
        versions = [v["version"] for v in registry.list_versions(name)]
        if not versions:
            raise Refused(404, "Not found", f"model {name!r} has no published version")
        a, b = check_pick(name, "a", a, versions), check_pick(name, "b", b, versions)
        configs = [read_config(registry, name, a), read_config(registry, name, b)]
    except Refused:
        raise
    except Exception as exc:
        raise store_failure(exc) from None
    rows = compare_rows(*(flat_settings(c) for c in configs))
    missing = list(dict.fromkeys(v for v, c in zip((a, b), configs, strict=True) if c is None))
    return page("compare.html", title=f"{name}: settings of {a} and {b}", name=name,
                a=a, b=b, rows=rows, missing=missing, differ=sum(r["differs"] for r in rows))
