"""Benchmark 5: publishing a 200 MB artifact to a local S3 server.

Our store (``S3Store.put_file``: SHA-256 of the file, multipart managed transfer with
``TransferConfig``, checksum and metadata on every part) vs one plain boto3
``put_object`` of the same bytes, against moto's standalone server on 127.0.0.1,
alternating, ``--reps`` times. Prints medians, MB/s, the ratio and the settings. There
is no target: the ratio is reported.

    .venv/bin/python bench/publishing.py [--mb 200] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import Report, median, timed  # noqa: E402
from support.s3server import MotoServer  # noqa: E402

from training.registry.s3 import S3Store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    report = Report(f"Publishing a {args.mb} MB artifact to a local S3 server")
    server = MotoServer()
    server.start()
    try:
        bucket = server.create_bucket()
        options = server.options(read_timeout_s=600)
        store = S3Store(bucket, "bench", options)
        client = server.client()
        path = Path(tempfile.mkdtemp(prefix="bench-publish-")) / "artifact.bin"
        with path.open("wb") as fh:
            for _ in range(args.mb):
                fh.write(os.urandom(1 << 20))
        ours, plain = [], []
        for rep in range(args.reps):
            plain.append(timed(lambda rep=rep: client.put_object(
                Bucket=bucket, Key=f"plain/{rep}", Body=path.read_bytes())))
            ours.append(timed(lambda rep=rep: store.put_file(f"ours/{rep}", path)))
        size = path.stat().st_size / 1e6
        report.figure(f"one put_object: median {median(plain):.2f} s ({size / median(plain):.0f}"
                      f" MB/s); our store: median {median(ours):.2f} s "
                      f"({size / median(ours):.0f} MB/s); ratio ours/plain "
                      f"{median(ours) / median(plain):.2f} ({args.reps} reps)")
        report.figure(f"settings: multipart threshold {options.multipart_threshold_mb} MB, "
                      f"chunk {options.multipart_chunksize_mb} MB, retry mode "
                      f"{options.retry_mode}, SHA-256 computed locally and sent per part")
    finally:
        server.kill()
    report.finish()


if __name__ == "__main__":
    main()
