"""The production pointer of each model: which version serves, how it got there.

``models/<name>/production.json`` (``layout.pointer_key``) holds the version in
production and the history of promotions. It is created with If-None-Match and
replaced with If-Match on the ETag read, so of two concurrent promotions exactly one
wins; the loser gets a ConflictError. The history lives inside the same object, so
pointer and history change together in one conditional write, and the pointer carries
the SHA-256 of its own canonical JSON, checked on every read.

Each history record says what happened (``action``: ``promoted``, ``rollback``, or a
decision that moved nothing: ``rejected`` by a reviewer, ``timed out`` waiting for one,
with the version in ``rejected``), when a person did it, who (``by``), and for a
version trained from production's weights (``model.warm_start``), which version it
started from (``warm_started_from``, read from the version's ``run.json``). A decision
that moved nothing before anything was promoted leaves a pointer whose ``version`` is
None.

``ProductionPointer`` is a mixin of ``ModelRegistry`` (``versions.py``): it uses the
registry's ``store``, ``check_model``, ``serving_keep``, ``followers``, ``verify`` and
``check_runs``.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from training.data.manifest import dumps
from training.errors import ConflictError, IntegrityError, RegistryError, shown
from training.files import sha256_bytes
from training.layout import RUN, pointer_key, validate_name, version_key
from training.registry.serving import ServingLayout

__all__ = ["ProductionPointer", "check_run_id", "check_time"]

POINTER_FORMAT = 1

log = logging.getLogger(__name__)


def check_time(field: str, value: Any) -> str:
    """``value`` if it is an ISO 8601 time (from the caller, never the clock); else
    RegistryError. Publish and promote both take one."""
    try:
        datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise RegistryError(
            f"{field} must be an ISO 8601 time string from the caller (for example the "
            f"run's logical date, '2025-01-31T00:00:00+00:00'), got {value!r}"
        ) from None
    return value


def check_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not run_id:
        raise RegistryError(f"run_id must be a non-empty string, got {run_id!r}")
    return run_id


def _pointer_sum(pointer: dict[str, Any]) -> str:
    """SHA-256 of a pointer's canonical JSON (without its own ``sha256`` field)."""
    return sha256_bytes(dumps(pointer))


class ProductionPointer:
    """Production, history, promote and rollback (a mixin of ``ModelRegistry``)."""

    _UNSET: Any = object()

    def _read_pointer(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        found = self.store.get_with_etag(pointer_key(name))
        if found is None:
            return None, None
        key = f"{self.store.uri}/{pointer_key(name)}"
        try:
            pointer = json.loads(found[0])
        except ValueError as exc:
            raise IntegrityError(
                f"production pointer of model {name!r} ({key}) is not valid JSON: {exc}; "
                "restore it from the store's versioning, or delete it and promote a version "
                "again"
            ) from exc
        if (not isinstance(pointer, dict) or "version" not in pointer
                or not isinstance(pointer["version"], (str, type(None)))
                or not isinstance(pointer.get("history"), list)):
            raise IntegrityError(
                f"production pointer of model {name!r} ({key}) is not a pointer: expected an "
                f"object with 'version' and 'history', got {shown(pointer)}; restore it, or "
                "delete it and promote a version again"
            )
        recorded = pointer.pop("sha256", None)  # pointers written before it carry none
        if recorded is not None and recorded != _pointer_sum(pointer):
            raise IntegrityError(
                f"production pointer of model {name!r} ({key}) does not match its SHA-256 "
                "(changed outside the registry); restore it, or delete it and promote a "
                "version again"
            )
        return pointer, found[1]

    def production(self, name: str) -> str | None:
        """The version in production, or None before the first promotion."""
        validate_name("model name", name)
        pointer, _ = self._read_pointer(name)
        return None if pointer is None else pointer["version"]

    def history(self, name: str) -> list[dict[str, Any]]:
        """Every promotion of ``name``, oldest first."""
        validate_name("model name", name)
        pointer, _ = self._read_pointer(name)
        return [] if pointer is None else list(pointer["history"])

    def promote(
        self,
        name: str,
        version: str,
        *,
        run_id: str,
        at: str,
        reason: str,
        forced: bool = False,
        expected_current: str | None = _UNSET,
        by: str | None = None,
        action: str = "promoted",
    ) -> dict[str, Any]:
        """Point production at ``version`` after verifying it; return the new pointer.

        ``at`` is an ISO 8601 time from the caller. ``expected_current`` (optional) is
        the version the decision was made against (None: nothing in production); if
        production has moved since, ConflictError. Of two concurrent promotions exactly
        one wins: the other gets ConflictError. Promoting the version already in
        production changes nothing and returns the pointer. ``by``: the person who
        asked for it (the Airflow user), recorded in the history.
        """
        validate_name("model name", name)
        validate_name("version", version)
        check_time("at", at)
        check_run_id(run_id)
        if not isinstance(reason, str) or not reason.strip():
            raise RegistryError(f"reason must be a non-empty string, got {reason!r}")
        pointer, etag = self._read_pointer(name)
        current = None if pointer is None else pointer["version"]
        if current == version:  # checked first: a retried promotion is a no-op
            return self._moved(name, pointer)  # ... but finishes what followed the move
        if expected_current is not self._UNSET and expected_current != current:
            raise ConflictError(
                f"production of model {name!r} moved: the decision to promote {version!r} "
                f"was made against {expected_current!r}, production is now {current!r}; "
                "decide again"
            )
        try:
            if self.check_model:  # downloads and verifies every file first
                self.check_runs_or_evaluated(name, version)
            else:
                self.verify(name, version)
        except IntegrityError as exc:
            raise IntegrityError(
                f"refusing to promote model {name!r} version {version!r}: {exc}"
            ) from exc
        except RegistryError as exc:
            raise RegistryError(
                f"refusing to promote model {name!r} version {version!r}: {exc}"
            ) from exc
        origin = self._warm_started_from(name, version)
        record = {"from": current, "to": version, "run_id": run_id, "at": at,
                  "reason": reason, "forced": bool(forced), "action": action,
                  **({"by": by} if by else {}),
                  **({"warm_started_from": origin} if origin else {})}
        return self._moved(name, self._write_pointer(
            name, pointer, etag, version, record, f"promotion of model {name!r} to {version!r}"))

    def _moved(self, name: str, pointer: dict[str, Any]) -> dict[str, Any]:
        """Every move of the pointer (a promotion, a rollback, from the pipeline, the
        Models page or the CLI) ends here: production pushed to the serving layout
        (``serving.py``; a failure fails the call, and calling again finishes it), then
        each follower told (the MLflow mirror: it never fails a promotion)."""
        ServingLayout(self.store, self.serving_keep).push(name, pointer)
        for follower in self.followers:
            try:
                follower.pointer_moved(name, pointer, self.store.uri)
            except Exception as exc:  # noqa: BLE001 - a mirror never fails a promotion
                log.warning("warning: %s did not follow model %s to %s: %s", follower, name,
                            pointer.get("version"), exc)
        return pointer

    def _warm_started_from(self, name: str, version: str) -> str | None:
        """The production version ``version``'s training started from (its
        ``run.json``'s ``warm_start``, ``training.train.warm_start``), or None. A store
        that does not answer fails the promotion before the pointer moves."""
        found = self.store.get_with_etag(version_key(name, version, RUN))
        if found is None:
            return None
        try:
            return (json.loads(found[0]).get("warm_start") or {}).get("from_version")
        except (ValueError, AttributeError):  # not a run record
            return None

    def record_decision(self, name: str, version: str, *, action: str, run_id: str,
                        at: str, reason: str, by: str | None = None) -> dict[str, Any]:
        """Record in the history that ``version`` was not promoted (``action``:
        ``rejected`` by ``by``, or ``timed out``), the pointer unmoved; the new pointer.
        Recording the same decision again (a retried task) changes nothing."""
        validate_name("model name", name)
        validate_name("version", version)
        check_time("at", at)
        check_run_id(run_id)
        if action not in ("rejected", "timed out"):
            raise RegistryError(f"action must be 'rejected' or 'timed out', got {action!r}")
        if not isinstance(reason, str) or not reason.strip():
            raise RegistryError(f"reason must be a non-empty string, got {reason!r}")
        pointer, etag = self._read_pointer(name)
        current = None if pointer is None else pointer["version"]
        record = {"from": current, "to": current, "rejected": version, "run_id": run_id,
                  "at": at, "reason": reason, "forced": False, "action": action,
                  **({"by": by} if by else {})}
        if pointer is not None and record in pointer["history"]:
            return pointer
        return self._write_pointer(name, pointer, etag, current, record,
                                   f"recording that {version!r} of model {name!r} was {action}")

    def _write_pointer(self, name: str, pointer: dict[str, Any] | None, etag: str | None,
                       version: str | None, record: dict[str, Any], what: str
                       ) -> dict[str, Any]:
        """Write the pointer at ``version`` with ``record`` appended to its history, if
        it is still the one read (``etag``)."""
        new = {
            "format": POINTER_FORMAT,
            "name": name,
            "version": version,
            "run_id": record["run_id"] if pointer is None or version != pointer["version"]
            else pointer["run_id"],
            "at": record["at"] if pointer is None or version != pointer["version"]
            else pointer["at"],
            "history": [*(pointer["history"] if pointer else []), record],
        }
        body = dumps({**new, "sha256": _pointer_sum(new)})  # verified on every read
        try:
            if etag is None:
                self.store.put_bytes(pointer_key(name), body, if_none_match=True)
            else:
                self.store.put_bytes(pointer_key(name), body, if_match=etag)
        except ConflictError as exc:
            raise ConflictError(
                f"{what} lost a race: production changed after it was read (it was "
                f"{record['from']!r}); another promotion won. Re-read production and "
                "decide again."
            ) from exc
        return new

    def rollback(
        self, name: str, version: str, *, run_id: str, at: str, note: str | None = None,
        by: str | None = None,
    ) -> dict[str, Any]:
        """Put an earlier complete version back in production (reason 'rollback').

        Rolling back to the version already in production changes nothing, so a
        retried rollback task gives the same result.
        """
        validate_name("model name", name)
        validate_name("version", version)
        current = self.production(name)
        if current is None:
            raise RegistryError(f"model {name!r} has nothing in production to roll back")
        reason = "rollback" if not note else f"rollback: {note}"
        return self.promote(
            name, version, run_id=run_id, at=at, reason=reason, expected_current=current,
            by=by, action="rollback",
        )
