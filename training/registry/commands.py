"""``python -m training models list|show|promote|rollback``: the registry from a shell.

``training.cli`` parses the command line and hands the ``models`` actions here. Each
prints its answer as JSON; ``show`` first checks the version as promotion does
(``ModelRegistry.check``: every file read back and compared with the manifest) and,
when a file is damaged or missing, prints one ``error:`` line per file instead and
exits with ``ERROR_EXIT``; ``--no-verify`` skips the reads and says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from training.errors import ERROR_EXIT, ConfigError
from training.registry.versions import ModelRegistry

log = logging.getLogger("training")

NEEDS = {"show": ("name", "version"), "promote": ("name", "version", "reason"),
         "rollback": ("name", "version")}


def check_args(args: argparse.Namespace) -> None:
    """ConfigError for a flag an action needs and lacks, or one it does not take."""
    for field in NEEDS.get(args.action, ()):
        if not getattr(args, field):
            raise ConfigError(f"models {args.action} needs --{field}")
    if not args.verify and args.action != "show":
        raise ConfigError(f"--no-verify applies to models show only, got models "
                          f"{args.action} (promote and rollback always verify)")


def models(args: argparse.Namespace) -> int:
    """Run one ``models`` action; the exit status."""
    check_args(args)
    from training.tracking import tracked_registry, tracker_from_env

    registry = tracked_registry(args.store_uri)
    now = datetime.now(UTC).isoformat(timespec="seconds")  # a person's action, not a retry
    if args.action == "sync-mlflow":
        tracker = tracker_from_env()
        if not tracker.enabled:
            raise ConfigError("models sync-mlflow needs a tracking server: set "
                              "TRAINING_MLFLOW_TRACKING_URI (or MLFLOW_TRACKING_URI)")
        out = tracker.sync(registry)
        print(json.dumps(out, indent=2))
        return ERROR_EXIT if "error" in out else 0
    if args.action == "list":
        out = _listed(registry, args.name)
    elif args.action == "show":
        out = show(registry, args.name, args.version, verify=args.verify)
        if out is None:
            return ERROR_EXIT
    elif args.action == "promote":
        out = registry.promote(args.name, args.version, run_id=f"manual-{args.version}",
                               at=now, reason=f"manual promotion: {args.reason}", forced=True)
    else:
        out = registry.rollback(args.name, args.version, run_id=f"rollback-{args.version}",
                                at=now, note=args.reason)
    print(json.dumps(out, indent=2))
    return 0


def _listed(registry: ModelRegistry, name: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in [name] if name else registry.list_models():
        versions = registry.list_versions(n)
        production = registry.production(n)
        out[n] = {"production": production, "versions": versions}
        if production is not None and production not in {v["version"] for v in versions}:
            out[n]["warning"] = (f"production points at version {production!r}, which is "
                                 "not a complete version in this store (deleted?); roll "
                                 "back to one that is")
            log.warning("model %s: %s", n, out[n]["warning"])
    return out


def show(registry: ModelRegistry, name: str, version: str, *,
         verify: bool = True) -> dict[str, Any] | None:
    """A version's manifest, its files first checked against it as promotion checks
    them (``ModelRegistry.check``), with the verdict, whether it is in production and
    the history; None, after one ``error:`` line per bad file on stderr."""
    if not verify:
        manifest = registry.show(name, version)
        verdict: dict[str, Any] = {
            "verified": False,
            "verification": "skipped (--no-verify): no file was read back or checked "
                            "against the manifest"}
    else:
        manifest, problems = registry.check(name, version)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if problems:
            return None
        verdict = {"verified": True, "verified_files": len(manifest["files"])}
    return {**manifest, **verdict, "production": registry.production(name) == version,
            "history": registry.history(name)}
