"""Clean-up of a team's staged data: snapshots and partition shards nothing refers to.

Staging never deletes: a partition replaced with other content gets new shards, and the
old ones stay for the snapshots that link them (``own_snapshot.py``). This command
(``python -m training clean-staging``) removes, for every dataset of a team's data
under the staging directory:

1. the snapshots that no run (``<output_dir>/<run id>/model/run.json``) and no model's
   production version (its published ``run.json``) was trained on, except the
   ``keep_latest`` most recently staged ones (the next night's cache hit); a snapshot
   being staged right now (its lock held) is left alone;
2. then the partitions' shards that no remaining snapshot lists (and leftovers of a
   staging that was killed), under the partitions' lock, so no staging links a
   partition while it goes.

A snapshot is matched by its key (``name:1.0.0@fingerprint``), so a run or a model
trained on another machine's copy of the same snapshot keeps it too. ``dry_run`` lists
what would go and removes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from training import layout
from training.data.snapshot.own_snapshot import PARTITIONS, partitions_lock
from training.errors import BusyError, ConfigError

log = logging.getLogger(__name__)


def referenced_keys(output_dir: str | os.PathLike[str] | None, registry: Any) -> set[str]:
    """The staged-dataset keys that runs under ``output_dir`` and the production
    versions in ``registry`` (None: no registry) were trained on."""
    keys = set()
    runs = Path(output_dir) if output_dir else None
    for run_json in sorted(runs.glob(f"*/{layout.MODEL_DIR}/{layout.RUN}")) if runs else []:
        keys.add(_key_of(run_json.read_bytes()))
    for name in registry.list_models() if registry is not None else []:
        version = registry.production(name)
        key = layout.version_key(name, version, layout.RUN) if version else None
        if key and registry.store.exists(key):
            keys.add(_key_of(registry.store.get_bytes(key)))
    return keys - {None}


def _key_of(run_json: bytes) -> Any:
    try:
        return json.loads(run_json).get("dataset", {}).get("key")
    except (ValueError, AttributeError):
        return None


def _snapshots(dataset: Path) -> list[tuple[Path, dict[str, Any]]]:
    """A dataset's snapshot directories with their manifests, oldest staged first."""
    found = []
    for manifest_path in dataset.glob(f"*/*/{layout.STAGING_MANIFEST}"):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            continue  # not whole: a staging at work, or one to stage again
        if "partitions" in manifest:  # a team's data (older snapshots too)
            found.append((manifest_path.stat().st_mtime, manifest_path.parent, manifest))
    return [(path, manifest) for _, path, manifest in sorted(found, key=lambda f: f[:2])]


def _size(path: Path) -> int:
    """Bytes that removing ``path`` frees (files with no other link)."""
    return sum(p.stat().st_size for p in path.rglob("*")
               if p.is_file() and p.stat().st_nlink == 1)


def _remove_snapshot(path: Path, dry_run: bool) -> bool:
    """Remove a snapshot directory and its bookkeeping unless it is being staged."""
    from training.locks import claim

    lock = path.with_name(path.name + ".lock")
    if dry_run:
        return True
    try:
        with claim(lock, f"staging directory {path}"):
            shutil.rmtree(path)
            path.with_name(path.name + ".fingerprint").unlink(missing_ok=True)
    except BusyError:
        log.info("clean-staging: %s is being staged: kept", path)
        return False
    lock.unlink(missing_ok=True)
    if not any(path.parent.iterdir()):
        path.parent.rmdir()
    return True


def clean(staging_dir: str | os.PathLike[str], referenced: set[str], *,
          keep_latest: int = 1, dry_run: bool = False) -> dict[str, Any]:
    """Remove what nothing refers to (module doc); what was (or would be) removed."""
    from training.locks import claim

    report: dict[str, Any] = {"removed_snapshots": [], "removed_partitions": [],
                              "kept_snapshots": [], "freed_bytes": 0, "dry_run": dry_run}
    for root in sorted(Path(staging_dir).glob(f"*/{PARTITIONS}")):
        if not root.is_dir():
            continue
        with claim(partitions_lock(root), f"the partitions in {root}", wait_s=600.0):
            snapshots = _snapshots(root.parent)
            latest = {path for path, _ in snapshots[len(snapshots) - keep_latest:]} \
                if keep_latest else set()
            linked: set[str] = set()
            for path, manifest in snapshots:
                key = f"{manifest['name']}:{manifest['version']}@{manifest['fingerprint']}"
                if key in referenced or path in latest:
                    report["kept_snapshots"].append(os.fspath(path))
                    linked.update(manifest.get("partition_dirs", []))
                    continue
                freed = _size(path)
                if _remove_snapshot(path, dry_run):
                    report["removed_snapshots"].append(os.fspath(path))
                    report["freed_bytes"] += freed
                else:
                    linked.update(manifest.get("partition_dirs", []))
            for partition in sorted(root.iterdir()):
                if partition.name in linked:
                    continue
                report["removed_partitions"].append(os.fspath(partition))
                report["freed_bytes"] += sum(p.stat().st_size for p in partition.rglob("*")
                                             if p.is_file())
                if not dry_run:
                    shutil.rmtree(partition)
    log.info("clean-staging: %d snapshots and %d partitions %s, %.1f MB",
             len(report["removed_snapshots"]), len(report["removed_partitions"]),
             "to remove" if dry_run else "removed", report["freed_bytes"] / 2**20)
    return report


def clean_staging(staging_dir: str, output_dir: str | None, store_uri: str | None, *,
                  keep_latest: int, dry_run: bool) -> dict[str, Any]:
    """The command: what runs and the registry's production models refer to, then
    ``clean``."""
    from training.registry import open_store
    from training.registry.versions import ModelRegistry

    if keep_latest < 0:
        raise ConfigError(f"--keep-latest must be 0 or more, got {keep_latest}")
    registry = ModelRegistry(open_store(store_uri)) if store_uri else None
    return clean(staging_dir, referenced_keys(output_dir, registry),
                 keep_latest=keep_latest, dry_run=dry_run)

