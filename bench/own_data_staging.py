"""Benchmark 8: staging a team's own images from S3, against a plain boto3 + PIL loop.

10,000 distinct 28x28 grayscale PNGs (the digits, upscaled, with per-copy noise) are
landed as one partition ``dt=2026-11-28/<label>/<n>.png`` (``_SUCCESS`` last) in a
bucket of moto's standalone server on 127.0.0.1. Then, alternating, ``--reps`` times,
in one process each as a task would (so TensorFlow's import is outside both timings):

- **ours**: ``staging.stage`` with ``data_source`` images into a fresh staging
  directory: list, fetch and decode (16 threads), split by hash, write the tfds shards,
  the manifest and the statistics;
- **plain**: one ``list_objects_v2`` paginator and a ``get_object`` + ``PIL.Image.open``
  + ``convert("L")`` + ``resize`` + ``numpy.asarray`` per object, in a loop, keeping
  the arrays in memory: what a script would do, with nothing written.

Prints images/s of both and the ratio (ours / plain). No target: the ratio is reported.

    .venv/bin/python bench/own_data_staging.py [--images 10000] [--reps 2]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import Report, median, run_python  # noqa: E402
from support.s3server import MotoServer  # noqa: E402

PARTITION = "dt=2026-11-28"

OURS = '''
import json, time
from training.config import DatasetConfig
from training.data import staging
from training.registry.s3 import S3Options
import tensorflow, tensorflow_datasets  # imported before the clock starts, as in a task
options = S3Options(**json.loads({options!r}))
start = time.perf_counter()
staged = staging.stage(DatasetConfig(name="bench_images", source="images", uri={uri!r},
                                     image_shape="28x28x1", staging_dir={staging!r}),
                       options)
print(json.dumps({{"seconds": time.perf_counter() - start, "key": staged.key}}))
'''

PLAIN = '''
import io, json, time
import boto3, numpy as np
from PIL import Image
client = boto3.client("s3", endpoint_url={endpoint!r}, region_name="us-east-1",
                      aws_access_key_id="testing-key-id",
                      aws_secret_access_key="testing-secret")
start = time.perf_counter()
images = []
for page in client.get_paginator("list_objects_v2").paginate(Bucket={bucket!r},
                                                               Prefix={prefix!r}):
    for item in page.get("Contents", []):
        if not item["Key"].endswith(".png"):
            continue
        body = client.get_object(Bucket={bucket!r}, Key=item["Key"])["Body"].read()
        with Image.open(io.BytesIO(body)) as image:
            images.append(np.asarray(image.convert("L").resize((28, 28)), dtype=np.uint8))
print(json.dumps({{"seconds": time.perf_counter() - start, "images": len(images)}}))
'''


def write_images(root: Path, count: int) -> None:
    """``count`` distinct PNGs under ``root/<label>/``."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(8)
    for n in range(count):
        index = n % len(digits.target)
        base = np.kron(digits.images[index] * (255.0 / 16.0), np.ones((4, 4)))[2:30, 2:30]
        noisy = np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)
        label_dir = root / str(digits.target[index])
        label_dir.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(noisy).save(buffer, format="PNG")
        (label_dir / f"{n:05d}.png").write_bytes(buffer.getvalue())


def main() -> None:
    import dataclasses
    import json

    from training.data.landing import land

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    report = Report(f"Staging {args.images} own images from a local S3 server")
    server = MotoServer()
    server.start()
    try:
        bucket = server.create_bucket()
        source = Path(tempfile.mkdtemp(prefix="bench-own-")) / "incoming"
        write_images(source / PARTITION, args.images)
        uri = f"s3://{bucket}/team/labelled"
        options = server.options(read_timeout_s=600)
        land(source, uri, PARTITION, store_options=options)
        options_json = json.dumps(dataclasses.asdict(options))
        ours, plain = [], []
        for _ in range(args.reps):
            staging = tempfile.mkdtemp(prefix="bench-own-staging-")
            mine = json.loads(run_python(OURS.format(options=options_json, uri=uri,
                                                     staging=staging)).splitlines()[-1])
            theirs = json.loads(run_python(PLAIN.format(
                endpoint=server.endpoint, bucket=bucket,
                prefix=f"team/labelled/{PARTITION}/")).splitlines()[-1])
            assert theirs["images"] == args.images, theirs
            ours.append(mine["seconds"])
            plain.append(theirs["seconds"])
            report.figure(f"rep: ours {mine['seconds']:.1f} s ({mine['key']}), "
                          f"plain {theirs['seconds']:.1f} s")
        rate_ours, rate_plain = args.images / median(ours), args.images / median(plain)
        report.figure(f"ours (staging.stage, images, 16 threads, tfds shards + manifest + "
                      f"statistics): {rate_ours:,.0f} images/s (median {median(ours):.1f} s)")
        report.figure(f"plain boto3 + PIL loop (in memory, nothing written): "
                      f"{rate_plain:,.0f} images/s (median {median(plain):.1f} s)")
        report.figure(f"ratio ours / plain: {rate_ours / rate_plain:.2f}x")
    finally:
        server.kill()
    report.finish()


if __name__ == "__main__":
    main()
