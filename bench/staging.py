"""Benchmark 4: the incremental staging curve: a night costs what is new.

A team's own images (``_team_images.py``: 28x28x1 PNGs, 600 a day, 10 labels, a
directory store of ``dt=YYYY-MM-DD/<label>/<n>.png`` partitions, ``_SUCCESS`` last).
For each N in ``--days`` (default 10, 20, 30, 40, 50, 60), in this one process
(TensorFlow and tensorflow-datasets imported before any clock), through the public
``training.data.snapshot.staging.stage`` only:

- **set-up, not timed**: a staging directory with N days staged (``stage`` with
  ``until`` = day N, no window, once), copied afresh for every repetition;
- **night N+1** (timed): ``stage`` with ``until`` = day N+1, no window, into that copy;
- **one day alone** (timed): ``stage`` with ``until`` = day N+1 and ``window_days`` 1
  into a fresh staging directory.

The two alternate (their order swapped every repetition), ``--reps`` times; medians.
Then the old benchmark 4's check, once: staging night N+1 again (a cache hit) in a
fresh interpreter with the staged data files (shards, decoded arrays) moved away: it
must still succeed, log a cache hit and give the same key, so it read no data.

Targets: at N = 30, night N+1 <= 1.3x one day alone; flat: night N+1 at N = 60 <=
1.3x at N = 10 (with ``--days``/``--max-days`` leaving those out: at the N nearest 30,
and the largest N against the smallest); the cached re-stage <= 2 s and reads no data.
Before incremental staging the curve grows linearly with N: the first two are missed.

    .venv/bin/python bench/staging.py [--reps 3] [--days 10 20 30 40 50 60]
        [--max-days 60] [--per-day 600]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from _common import Report, median, run_python
from _team_images import SHAPE, cached_directory_store, day

NAME = "bench_team"
RATIO_AT = 30  # the N of the "night N+1 <= 1.3x one day alone" target
LIMIT = 1.3
RESTAGE_LIMIT_S = 2.0  # a cache hit, in a fresh interpreter, imports included
DATA_FILES = ("*.tfrecord*", "*.array_record*", "*.npy", "*.npz", "*.riegeli*")

RESTAGE = '''
import io, json, logging, time
stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=stream)
start = time.perf_counter()
from training.config import DatasetConfig
from training.data.snapshot import staging
staged = staging.stage(DatasetConfig(**json.loads({cfg!r})))
print(json.dumps({{"seconds": time.perf_counter() - start, "key": staged.key,
                  "cache_hit": "cache hit" in stream.getvalue()}}))
'''


def config(uri: str, staging_dir: str, until: str, window_days: int) -> dict:
    return {"name": NAME, "source": "images", "uri": uri, "image_shape": SHAPE,
            "staging_dir": staging_dir, "until": until, "window_days": window_days}


def stage(settings: dict) -> tuple[float, str]:
    """Seconds of one ``staging.stage`` call, and the staged key; tfds's prints hidden."""
    from training.config import DatasetConfig
    from training.data.snapshot import staging

    cfg = DatasetConfig(**settings)
    with contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        staged = staging.stage(cfg)
        seconds = time.perf_counter() - start
    return seconds, staged.key


def hide_data(root: Path) -> list[tuple[Path, Path]]:
    moved = []
    for pattern in DATA_FILES:
        for path in list(root.rglob(pattern)):
            if path.is_file() and not path.name.startswith(".hidden-"):
                hidden = path.with_name(".hidden-" + path.name)
                path.rename(hidden)
                moved.append((hidden, path))
    return moved


def restage_without_data(settings: dict) -> dict:
    """Stage ``settings`` again (already staged) in a fresh interpreter, the data files
    moved away; its seconds (imports included), key and whether it logged a cache hit."""
    moved = hide_data(Path(settings["staging_dir"]))
    try:
        result = json.loads(run_python(RESTAGE.format(cfg=json.dumps(settings)))
                            .strip().splitlines()[-1])
    except RuntimeError as exc:
        result = {"error": str(exc).strip().splitlines()[-1]}
    finally:
        for hidden, path in moved:
            hidden.rename(path)
    return {**result, "moved": len(moved)}


def nearest(days: list[int], wanted: int) -> int:
    return min(days, key=lambda n: (abs(n - wanted), n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--days", type=int, nargs="+", default=[10, 20, 30, 40, 50, 60],
                        help="the N of the curve: days already staged")
    parser.add_argument("--max-days", type=int, default=60,
                        help="leave out every N above this (quick runs)")
    parser.add_argument("--per-day", type=int, default=600)
    args = parser.parse_args()
    days = sorted({n for n in args.days if 1 <= n <= args.max_days})
    if not days:
        parser.error("no N left: --days and --max-days leave none")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow  # noqa: F401  (imported before any clock, as in a task)
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    logging.getLogger("absl").setLevel(logging.WARNING)

    report = Report(f"Incremental staging: night N+1 with N days staged vs one day alone "
                    f"({args.per_day} images a day)")
    start = time.perf_counter()
    uri = cached_directory_store(max(days) + 1, args.per_day)
    report.figure(f"{max(days) + 1} days of {args.per_day} PNGs landed in {uri} "
                  f"({time.perf_counter() - start:.0f} s, kept between runs)")
    work = Path(tempfile.mkdtemp(prefix="bench-staging-"))
    try:
        bases = {}
        for n in days:  # set-up, not timed
            bases[n] = work / f"staged-{n}-days"
            seconds, _ = stage(config(uri, os.fspath(bases[n]), day(n), 0))
            report.figure(f"set-up: {n} days staged in {seconds:.1f} s (not timed)")
        night: dict[int, list[float]] = {n: [] for n in days}
        alone: dict[int, list[float]] = {n: [] for n in days}
        for rep in range(args.reps):
            for n in days:
                copy = work / f"rep{rep}-night-{n + 1}"
                shutil.copytree(bases[n], copy)
                fresh = work / f"rep{rep}-alone-{n + 1}"
                pair = [("night", config(uri, os.fspath(copy), day(n + 1), 0)),
                        ("alone", config(uri, os.fspath(fresh), day(n + 1), 1))]
                for kind, settings in pair if rep % 2 == 0 else reversed(pair):
                    seconds, _ = stage(settings)
                    (night if kind == "night" else alone)[n].append(seconds)
                if rep < args.reps - 1 or n != days[0]:
                    shutil.rmtree(copy)
                shutil.rmtree(fresh)
            report.figure(f"rep {rep + 1}: night N+1 " + ", ".join(
                f"N={n} {night[n][-1]:.2f} s" for n in days))

        report.figure(f"curve (medians of {args.reps} reps): N | night N+1 with N days "
                      "staged | day N+1 alone | ratio")
        for n in days:
            report.figure(f"  {n:3d} | {median(night[n]):7.2f} s | {median(alone[n]):6.2f} s"
                          f" | {median(night[n]) / median(alone[n]):5.2f}x")

        kept = config(uri, os.fspath(work / f"rep{args.reps - 1}-night-{days[0] + 1}"),
                      day(days[0] + 1), 0)
        _, key = stage(kept)  # already staged: a cache hit, its key
        again = restage_without_data(kept)
        no_data = (again.get("key") == key and again.get("cache_hit", False)
                   and again["moved"] > 0)
        report.figure(f"cached re-stage of night {days[0] + 1} in a fresh interpreter "
                      f"(imports included), {again['moved']} data files moved away: "
                      + (f"{again['seconds']:.2f} s, cache hit, same key" if no_data
                         else f"FAILED: {again}"))

        at = nearest(days, RATIO_AT)
        ratio = median(night[at]) / median(alone[at])
        report.target(f"at N={at}, night N+1 <= {LIMIT}x one day alone", ratio <= LIMIT,
                      f"{median(night[at]):.2f} s vs {median(alone[at]):.2f} s: "
                      f"{ratio:.2f}x")
        low, high = days[0], days[-1]
        flat = median(night[high]) / median(night[low])
        if len(days) > 1:
            report.target(f"flat: night N+1 at N={high} <= {LIMIT}x at N={low}",
                          flat <= LIMIT, f"{median(night[high]):.2f} s vs "
                          f"{median(night[low]):.2f} s: {flat:.2f}x")
        else:
            report.figure("flat: not checked (one N only)")
        report.target(f"cached re-stage <= {RESTAGE_LIMIT_S:g} s", no_data
                      and again["seconds"] <= RESTAGE_LIMIT_S,
                      f"{again['seconds']:.2f} s" if no_data else "it failed")
        report.target("cached re-stage reads no data", no_data,
                      "succeeded without the data files" if no_data else "it needed them")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.finish()


if __name__ == "__main__":
    main()
