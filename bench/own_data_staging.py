"""Benchmark 8: staging a team's own images from SeaweedFS at the S3 server's pace.

SeaweedFS (``weed mini``, the tests' ``S3Server``: 127.0.0.1, free ports, a temporary
directory, stopped at the end) holds ``2 x --images`` 28x28x1 PNGs landed as days of
``--per-day`` (``_team_images.py``; ``_SUCCESS`` last). Then, alternating (the order
turned every repetition), ``--reps`` times, each in a child process with its imports
done before the clock starts (as in a task):

- **staging**: ``training.data.snapshot.staging.stage`` of the first ``--images`` (``until`` =
  their last day, no window) into a fresh staging directory, the S3 options of the
  team's identity: list, fetch, decode, split, shards, manifest, statistics; its peak
  RSS during the call (``VmHWM`` reset after the imports) and its RSS before it;
- **GET loop**: the same listing, then a ``ThreadPoolExecutor`` of boto3 ``get_object``
  + ``read()`` over the same objects, nothing decoded or written: what the server
  gives, for each of ``--threads`` (best of them).

Then staging of all ``2 x --images`` (``--scale-reps`` times): memory must be flat in
the number of images, so its peak RSS above the imports is printed beside the first's.

Target: staging >= 0.8x the best GET loop in images/s. Peak RSS: reported.

    .venv/bin/python bench/own_data_staging.py [--images 6000] [--per-day 600]
        [--reps 3] [--threads 16 32] [--scale-reps 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, Report, median, run_python
from _team_images import SHAPE, day, land_days

sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from support.s3server import S3Server  # noqa: E402

LIMIT = 0.8
PREFIX = "team/labelled"

MEMORY = '''
def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False
'''

STAGE = MEMORY + '''
import contextlib, io, json, time
from training.config import DatasetConfig
from training.data.snapshot import staging
from training.registry.s3 import S3Options
import tensorflow, tensorflow_datasets  # imported before the clock, as in a task
options = S3Options(**json.loads({options!r}))
cfg = DatasetConfig(**json.loads({cfg!r}))
before = rss_kb("VmRSS")
reset = reset_peak()
with contextlib.redirect_stdout(io.StringIO()):
    start = time.perf_counter()
    staged = staging.stage(cfg, options)
    seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "key": staged.key, "rss_before_kb": before,
                  "peak_kb": rss_kb("VmHWM"), "peak_reset": reset}}))
'''

GET_LOOP = '''
import json, time
from concurrent.futures import ThreadPoolExecutor
import boto3
from botocore.config import Config
options = json.loads({options!r})
client = boto3.client(
    "s3", endpoint_url=options["endpoint_url"], region_name=options["region_name"],
    aws_access_key_id=options["aws_access_key_id"],
    aws_secret_access_key=options["aws_secret_access_key"],
    config=Config(s3={{"addressing_style": "path"}}, max_pool_connections={threads}))
partitions = set(json.loads({partitions!r}))
start = time.perf_counter()
keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(
            Bucket={bucket!r}, Prefix={prefix!r}) for item in page.get("Contents", [])]
keys = [k for k in keys if k.endswith(".png") and k.split("/")[2] in partitions]
def get(key):
    return len(client.get_object(Bucket={bucket!r}, Key=key)["Body"].read())
with ThreadPoolExecutor({threads}) as pool:
    total = sum(pool.map(get, keys))
print(json.dumps({{"seconds": time.perf_counter() - start, "images": len(keys),
                  "bytes": total}}))
'''


def last_line(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def stage_child(options: dict, uri: str, days: int, staging_dir: str) -> dict:
    cfg = {"name": "bench_own", "source": "images", "uri": uri, "image_shape": SHAPE,
           "staging_dir": staging_dir, "until": day(days), "window_days": 0}
    result = last_line(run_python(STAGE.format(options=json.dumps(options),
                                               cfg=json.dumps(cfg))))
    shutil.rmtree(staging_dir, ignore_errors=True)
    return result


def get_loop_child(options: dict, bucket: str, days: int, threads: int) -> dict:
    partitions = [f"dt={day(n)}" for n in range(1, days + 1)]
    return last_line(run_python(GET_LOOP.format(
        options=json.dumps(options), bucket=bucket, prefix=f"{PREFIX}/", threads=threads,
        partitions=json.dumps(partitions))))


def mb(kb: float) -> str:
    return f"{kb / 1024:,.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--per-day", type=int, default=600)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--scale-reps", type=int, default=1,
                        help="stagings of 2 x --images for the memory scaling (0: none)")
    args = parser.parse_args()
    days = math.ceil(args.images / args.per_day)
    images = days * args.per_day
    report = Report(f"Own images from SeaweedFS on 127.0.0.1: staging vs a threaded boto3 "
                    f"GET loop ({images} images, {days} days)")
    work = Path(tempfile.mkdtemp(prefix="bench-own-"))
    server = S3Server(work / "s3")
    server.start()
    try:
        bucket = server.create_bucket()
        uri = f"s3://{bucket}/{PREFIX}"
        options = dataclasses.asdict(server.options(read_timeout_s=60))
        start = time.perf_counter()
        land_days(uri, range(1, 2 * days + 1), args.per_day,
                  store_options=server.options(read_timeout_s=60))
        report.figure(f"landed {2 * days} days of {args.per_day} PNGs on SeaweedFS "
                      f"({server.endpoint}) in {time.perf_counter() - start:.0f} s")
        stagings: list[dict] = []
        loops: dict[int, list[float]] = {t: [] for t in args.threads}
        contenders = ["staging", *args.threads]
        for rep in range(args.reps):
            for contender in contenders if rep % 2 == 0 else reversed(contenders):
                if contender == "staging":
                    result = stage_child(options, uri, days, str(work / f"staging-{rep}"))
                    stagings.append(result)
                    figure = f"staging {result['seconds']:.1f} s"
                else:
                    result = get_loop_child(options, bucket, days, contender)
                    assert result["images"] == images, result
                    loops[contender].append(result["seconds"])
                    figure = f"GET loop x{contender} {result['seconds']:.1f} s"
                report.figure(f"rep {rep + 1}: {figure}")
        scaled = [stage_child(options, uri, 2 * days, str(work / f"staging-2x-{rep}"))
                  for rep in range(args.scale_reps)]

        staging_rate = images / median([s["seconds"] for s in stagings])
        loop_rates = {t: images / median(seconds) for t, seconds in loops.items()}
        best = max(loop_rates, key=loop_rates.get)
        report.figure(f"staging (staging.stage, fresh staging directory): {staging_rate:,.0f}"
                      f" images/s (median {median([s['seconds'] for s in stagings]):.1f} s, "
                      f"{args.reps} reps)")
        for threads, rate in loop_rates.items():
            report.figure(f"GET loop, {threads} threads (list + get_object + read): "
                          f"{rate:,.0f} images/s (median {median(loops[threads]):.1f} s)")
        peak = median([s["peak_kb"] for s in stagings])
        growth = median([s["peak_kb"] - s["rss_before_kb"] for s in stagings])
        reset = all(s["peak_reset"] for s in stagings + scaled)
        report.figure(f"staging's peak RSS at {images} images: {mb(peak)} ({mb(growth)} above "
                      f"its RSS after the imports" + ("" if reset else "; VmHWM could not be "
                      "reset: the peak includes the imports") + ")")
        if scaled:
            peak2 = median([s["peak_kb"] for s in scaled])
            growth2 = median([s["peak_kb"] - s["rss_before_kb"] for s in scaled])
            report.figure(f"staging's peak RSS at {2 * images} images: {mb(peak2)} "
                          f"({mb(growth2)} above the imports; "
                          f"{2 * images / median([s['seconds'] for s in scaled]):,.0f} "
                          f"images/s): the growth above the imports is "
                          f"{growth2 / max(growth, 1):.2f}x the one at {images} (flat: 1.0)")
        ratio = staging_rate / loop_rates[best]
        report.target(f"staging >= {LIMIT}x the best threaded GET loop (images/s)",
                      ratio >= LIMIT, f"{staging_rate:,.0f} vs {loop_rates[best]:,.0f} "
                      f"images/s ({best} threads): {ratio:.2f}x")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report.finish()


if __name__ == "__main__":
    main()
