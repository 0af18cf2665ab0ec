"""Landing: one day's labelled images copied into the data store as a transaction.

A team's labelled images arrive as partitions, one directory per day::

    <data_uri>/dt=YYYY-MM-DD/<label>/<image file>
    <data_uri>/dt=YYYY-MM-DD/_SUCCESS       written last: the partition is complete

``data_uri`` is a local directory or ``s3://bucket/prefix`` (``training.registry.
open_store``). ``land(source_dir, data_uri, partition)`` copies
``<source_dir>/<partition>/<label>/<file>`` in three steps:

1. the claim ``_LANDING``: this content's SHA-256, so that a lander of other content is
   refused while this one works (create-only, or if-match on the claim just read);
2. every file, checked against the SHA-256 read in step 1 (the bytes hashed are the
   bytes uploaded);
3. the marker ``_SUCCESS``, last (create-only): canonical JSON with ``files``, ``bytes``,
   ``sha256`` over the sorted ``(path, sha256)`` list, and the ``entries`` themselves,
   so a reader copies and checks exactly the landed files.

Landing the same content again is a no-op (``landed: False``); a landing of the same
content that a crash cut short is finished. Different content is refused
(``DatasetError``, nothing written) when the partition has landed or is being landed,
unless ``replace=True``: a replacement turns ``_SUCCESS`` into ``{"state":
"replacing"}`` (if-match) before it writes a file, so readers skip the partition until
the new marker is in. Read markers with ``read_marker``: it returns only complete ones.

Command line (one ``error:`` line on failure, through ``training.entry.run_command``)::

    python -m training.data.sources.landing demo --out DIR [--start 2026-11-28
                                     --days 3 --drift-day 3 --skip-day N --seed N]
    python -m training.data.sources.landing land --from DIR --partition dt=2026-11-28
                                     --to URI [--replace]

For an ``s3://`` URI the command line uses boto3's default chain (``AWS_*``); the
Airflow task passes S3Options from its connection.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from training.data.manifest import dumps
from training.entry import run_command
from training.errors import ConfigError, ConflictError, DatasetError, shown

__all__ = ["SUCCESS", "check_partition", "land", "marker_key", "read_marker"]

SUCCESS = "_SUCCESS"
LANDING = "_LANDING"  # the claim of the lander at work
MARKER_FORMAT = "training.landing/1"
PARTITION_WORDS = "dt=YYYY-MM-DD with a real date, like dt=2026-11-28"
_PARTITION_RE = re.compile(r"dt=([0-9]{4}-[0-9]{2}-[0-9]{2})")
THREADS = 8  # files read and uploaded at a time


def check_partition(value: Any) -> str:
    """``value`` if it names a day's partition (``dt=YYYY-MM-DD``), else ConfigError."""
    match = _PARTITION_RE.fullmatch(value) if isinstance(value, str) else None
    try:
        if match:
            dt.date.fromisoformat(match.group(1))
            return value
    except ValueError:
        pass
    raise ConfigError(f"partition must be {PARTITION_WORDS}, got {shown(value)}")


def marker_key(partition: str) -> str:
    return f"{check_partition(partition)}/{SUCCESS}"


def content_sha256(entries: list[dict[str, Any]]) -> str:
    """SHA-256 over the sorted ``(path, sha256)`` list: what the partition holds."""
    pairs = sorted((e["path"], e["sha256"]) for e in entries)
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()


def _read(store: Any, key: str) -> tuple[dict[str, Any] | None, str | None]:
    found = store.get_with_etag(key)
    if found is None:
        return None, None
    data, etag = found
    try:
        marker = json.loads(data)
    except ValueError:
        marker = None
    if not isinstance(marker, dict):
        raise DatasetError(f"{key!r} in {store.uri} is not a JSON object, got {shown(data)}; "
                           f"land the partition again with replace=True")
    return marker, etag


def read_marker(store: Any, partition: str) -> dict[str, Any] | None:
    """The ``_SUCCESS`` marker of a landed partition, or None: not landed, or being
    replaced (the one moment its ``_SUCCESS`` says ``"state": "replacing"``)."""
    marker, _ = _read(store, marker_key(partition))
    return marker if marker is not None and marker.get("state") == "complete" else None


def _source_files(root: Path) -> list[tuple[Path, str]]:
    """Every file of the source partition with its ``<label>/<file>`` path, checked."""
    if not root.is_dir():
        raise DatasetError(f"no partition directory {os.fspath(root)!r}: expected "
                           f"<source_dir>/{root.name}/<label>/<image file>")
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        parts = path.relative_to(root).parts
        if len(parts) != 2 or any(p.startswith((".", "_")) for p in parts):
            raise DatasetError(
                f"files of a partition must be <label>/<image file> (names not starting "
                f"with '.' or '_'), got {shown('/'.join(parts))} in {os.fspath(root)!r}")
        files.append((path, "/".join(parts)))
    if not files:
        raise DatasetError(f"partition directory {os.fspath(root)!r} holds no files; "
                           f"expected <label>/<image file>")
    return files


def _plan(files: list[tuple[Path, str]]) -> list[dict[str, Any]]:
    def entry(item: tuple[Path, str]) -> dict[str, Any]:
        data = item[0].read_bytes()
        return {"path": item[1], "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        return list(pool.map(entry, files))


def _upload(store: Any, partition: str, path: Path, planned: dict[str, Any]) -> None:
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != planned["sha256"]:
        raise DatasetError(f"{os.fspath(path)!r} changed while it was being landed; "
                           f"land the partition again once its files stay put")
    store.put_bytes(f"{partition}/{planned['path']}", data)


def _summary(marker: dict[str, Any], data_uri: str, landed: bool) -> dict[str, Any]:
    return {"partition": marker["partition"], "data_uri": data_uri, "files": marker["files"],
            "bytes": marker["bytes"], "sha256": marker["sha256"], "landed": landed}


def _absolute(data_uri: Any) -> Any:
    if isinstance(data_uri, str) and data_uri and "://" not in data_uri:
        return os.path.abspath(data_uri)
    return data_uri


def _refuse(partition: str, store: Any, old: dict[str, Any], new: dict[str, Any],
            source: str, what: str, hint: str = "") -> DatasetError:
    return DatasetError(
        f"partition {partition} in {store.uri} {what} with other content ({old.get('files')} "
        f"files, sha256 {str(old.get('sha256'))[:16]}); got {new['files']} files, sha256 "
        f"{new['sha256'][:16]} from {source!r}; land it as a new partition, or replace it "
        f"(replace=True, --replace){hint}")


def _claim(store: Any, partition: str, marker: dict[str, Any], source: str,
           replace: bool) -> None:
    """Claim the partition for this content (``_LANDING``): refused while another content
    holds it, unless ``replace``; create-only, or if-match on the claim just read."""
    claim = {key: marker[key] for key in ("format", "partition", "files", "bytes", "sha256")}
    key = f"{partition}/{LANDING}"
    old, etag = _read(store, key)
    if old is not None and old.get("sha256") != marker["sha256"] and not replace:
        raise _refuse(partition, store, old, marker, source, "is being landed",
                      " if that landing was cut short")
    try:
        store.put_bytes(key, dumps(claim), if_none_match=etag is None, if_match=etag)
    except ConflictError:
        raise ConflictError(f"partition {partition} in {store.uri} was claimed by another "
                            f"lander at the same moment; land it again") from None


def land(source_dir: str | os.PathLike[str], data_uri: str, partition: str, *,
         store_options: Any = None, replace: bool = False) -> dict[str, Any]:
    """Copy ``<source_dir>/<partition>`` into the store at ``data_uri`` (module doc).

    Returns ``{"partition", "data_uri", "files", "bytes", "sha256", "landed"}``;
    ``landed`` is False when the same content had already landed (nothing written).
    """
    from training.registry import open_store

    check_partition(partition)
    data_uri = _absolute(data_uri)
    source = os.fspath(source_dir)
    files = _source_files(Path(source_dir) / partition)
    entries = _plan(files)
    marker = {"format": MARKER_FORMAT, "partition": partition, "state": "complete",
              "files": len(entries), "bytes": sum(e["size"] for e in entries),
              "sha256": content_sha256(entries), "entries": entries}
    store = open_store(data_uri, store_options)
    key = marker_key(partition)
    old, etag = _read(store, key)
    same = old is not None and old.get("sha256") == marker["sha256"]
    if same and old.get("state") == "complete":
        return _summary(old, data_uri, landed=False)
    if old is not None and not same and not replace:  # landed with other content
        raise _refuse(partition, store, old, marker, source, "already landed")
    _claim(store, partition, marker, source, replace)
    if old is not None and not same:  # readers skip the partition until it is complete
        etag = store.put_bytes(key, dumps({"partition": partition, "state": "replacing",
                                           "files": marker["files"],
                                           "sha256": marker["sha256"]}), if_match=etag)
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for done in [pool.submit(_upload, store, partition, path, planned)
                     for (path, _), planned in zip(files, entries, strict=True)]:
            done.result()
    try:
        store.put_bytes(key, dumps(marker), if_none_match=etag is None, if_match=etag)
    except ConflictError:
        winner = read_marker(store, partition)  # a lander of the same content finished first
        if winner is not None and winner.get("sha256") == marker["sha256"]:
            return _summary(winner, data_uri, landed=False)
        raise
    return _summary(marker, data_uri, landed=True)


# --- the command line ------------------------------------------------------------------

PROG = "python -m training.data.sources.landing"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write demo partitions, or land one partition into the data store.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="write the digits as daily partitions of PNGs")
    demo.add_argument("--out", required=True, help="directory to write dt=.../ into")
    demo.add_argument("--start", default="2026-11-28", help="first date, YYYY-MM-DD")
    demo.add_argument("--days", type=int, default=3, help="number of dates (default 3)")
    demo.add_argument("--drift-day", type=int, default=3,
                      help="1-based day whose images drift (0: none; default 3)")
    demo.add_argument("--skip-day", type=int, default=0,
                      help="1-based day with no new data, not written (0: none)")
    demo.add_argument("--holdout", type=int, default=0,
                      help="images kept out of every day as a pinned holdout, written to "
                           "<out>/holdout/<label>/ (default 0: none)")
    demo.add_argument("--seed", type=int, default=None, help="shuffle seed")
    land_cmd = commands.add_parser("land", help="copy one partition into the data store")
    land_cmd.add_argument("--from", dest="source_dir", required=True,
                          help="directory holding <partition>/<label>/<file>")
    land_cmd.add_argument("--partition", required=True, help="dt=YYYY-MM-DD")
    land_cmd.add_argument("--to", dest="data_uri", required=True,
                          help="the data store: a directory or s3://bucket/prefix")
    land_cmd.add_argument("--replace", action="store_true",
                          help="replace a landed partition whose content differs")
    return parser


def execute(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from training.data.sources.demo import DEMO_SEED, write_demo_partitions

        result = write_demo_partitions(
            args.out, start=args.start, days=args.days, drift_day=args.drift_day,
            skip_day=args.skip_day, holdout=args.holdout,
            seed=DEMO_SEED if args.seed is None else args.seed)
    else:
        result = land(args.source_dir, args.data_uri, args.partition, replace=args.replace)
    print(json.dumps(result, sort_keys=True))
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    return run_command(lambda: execute(args))


if __name__ == "__main__":
    sys.exit(main())
