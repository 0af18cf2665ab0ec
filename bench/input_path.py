"""Benchmark 11: the input path for real images, against a plain tf.data reference.

``--images`` JPEGs (default 3,000) of 96 to 192 pixels a side, RGB, 10 labels, are
written as a team's partition ``dt=2026-11-30/<label>/<n>.jpg`` (``_SUCCESS`` last).
Both pipelines read the same training images (the hash split's ``train``, 70%), give
64x64x3 uint8 batches of 64 with a random left-right flip and a random crop (padded by
1/8), and are iterated with nothing else running (no model), one epoch after another,
in one process:

- **ours**: ``staging.stage`` (source images, ``image_shape`` 64x64x3: every file
  decoded and resized once, by Pillow in 16 threads) - timed apart, once - then
  ``choose.make_dataset(..., augment="flip_crop")`` over the staged shards, with
  ``input_cache`` ``memory`` and ``none``;
- **plain**: the tf.data guide's pipeline over the files: ``from_tensor_slices`` of
  paths, a parallel map of ``read_file`` + ``decode_jpeg`` + ``resize``, ``cache()``,
  ``shuffle`` (10,000, as ours); not cached: the paths shuffled, then decoded every
  epoch. Then a parallel map of ``random_flip_left_right`` + ``random_crop``,
  ``batch``, ``prefetch``.

Per pipeline: the first epoch (building the pipeline and filling its cache included)
and the median of the later epochs, in examples/s of wall time and per CPU-second
(``time.process_time``: every thread of the process). The ratio is ours / plain.

Target: not cached (``input_cache: none``), later epochs, ours >= 0.95x plain, in wall
time and per CPU-second. Cached and first epochs: reported.

    .venv/bin/python bench/input_path.py [--images 3000] [--epochs 4] [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import Report, median

PARTITION = "dt=2026-11-30"
SHAPE = (64, 64, 3)
BATCH = 64
SHUFFLE_BUFFER = 10_000  # dataset.shuffle_buffer's default
LIMIT = 0.95  # ours / plain, not cached, later epochs, wall and per CPU-second


def write_images(root: Path, count: int) -> list[tuple[Path, int]]:
    """``count`` distinct JPEGs of varied sizes under ``root/PARTITION/<label>/``; the
    files with their label index."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(10)
    part = root / PARTITION
    files = []
    for n in range(count):
        label = n % 10
        height, width = rng.integers(96, 193, size=2)
        # A smooth colour field per image (compresses like a photo, unlike noise).
        low = rng.integers(0, 256, size=(6, 6, 3)).astype(np.uint8)
        image = Image.fromarray(low).resize((int(width), int(height)), Image.BILINEAR)
        path = part / f"label{label}" / f"{n}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, quality=90)
        files.append((path, label))
    (part / "_SUCCESS").write_text("")
    return files


def epochs(make, count: int) -> dict[str, float]:
    """Seconds and CPU-seconds of the first epoch (``make()`` included) and the median
    later epoch, and the examples an epoch gives."""
    wall, cpu = time.perf_counter(), time.process_time()
    ds = make()
    examples = sum(int(images.shape[0]) for images, _ in ds)
    first = (time.perf_counter() - wall, time.process_time() - cpu)
    later = []
    for _ in range(count - 1):
        wall, cpu = time.perf_counter(), time.process_time()
        for _batch in ds:
            pass
        later.append((time.perf_counter() - wall, time.process_time() - cpu))
    return {"examples": examples, "first_s": first[0], "first_cpu": first[1],
            "later_s": median([w for w, _ in later]), "later_cpu": median([c for _, c in later])}


def plain(files: list[tuple[Path, int]], cache: bool, seed: int):
    import tensorflow as tf

    def load(path, label):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=SHAPE[2])
        image = tf.image.resize(image, SHAPE[:2], antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8), label

    def augment(image, label):
        image = tf.image.random_flip_left_right(image)
        pad = SHAPE[0] // 8
        image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
        return tf.image.random_crop(image, SHAPE), label

    def make():
        paths = [os.fspath(p) for p, _ in files]
        labels = [label for _, label in files]
        ds = tf.data.Dataset.from_tensor_slices((paths, labels))
        if cache:  # the tutorial's order: decode, cache, then shuffle the decoded images
            ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).cache()
            ds = ds.shuffle(SHUFFLE_BUFFER, seed=seed)
        else:  # shuffle the paths, decode every epoch
            ds = ds.shuffle(len(paths), seed=seed)
            ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)

    return make


def ours(builder, split: str, cache: str, seed: int):
    from training.data.input.choose import make_dataset

    def make():
        return make_dataset(builder, split, global_batch_size=BATCH, shuffle=True,
                            seed=seed, cache=cache, augment="flip_crop")

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    import tensorflow  # noqa: F401  (imported before any clock)

    from training.config import DatasetConfig
    from training.data.input.choose import load_builder
    from training.data.snapshot import staging
    from training.data.snapshot.splits import split_names
    from training.data.sources import images

    report = Report("Input path for real images: ours vs a plain tf.data pipeline")
    work = Path(tempfile.mkdtemp(prefix="bench-input-"))
    files = write_images(work / "data", args.images)
    train_files = [(p, label) for p, label in files
                   if images.split_of(p.read_bytes(), 20, 10) == "train"]
    cfg = DatasetConfig(name="bench_jpegs", source="images", uri=os.fspath(work / "data"),
                        image_shape="x".join(map(str, SHAPE)),
                        staging_dir=os.fspath(work / "staging"))
    start = time.perf_counter()
    staged = staging.stage(cfg)
    report.figure(f"staging {args.images} JPEGs once (decode + resize + shards + "
                  f"statistics): {time.perf_counter() - start:.1f} s")
    builder = load_builder(staged)
    split = split_names(builder, cfg.validation_fraction)["train"]
    cases = {
        "ours, cached": ours(builder, split, "memory", 0),
        "plain, cached": plain(train_files, True, 0),
        "ours, not cached": ours(builder, split, "none", 0),
        "plain, not cached": plain(train_files, False, 0),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for rep in range(args.reps):
        order = list(cases) if rep % 2 == 0 else list(reversed(cases))
        for name in order:
            runs[name].append(epochs(cases[name], args.epochs))
    rates = {}
    for name, results in runs.items():
        n = results[0]["examples"]
        row = {key: median([r[key] for r in results])
               for key in ("first_s", "first_cpu", "later_s", "later_cpu")}
        rates[name] = {"first": n / row["first_s"], "later": n / row["later_s"],
                       "later_cpu": n / row["later_cpu"], "first_cpu": n / row["first_cpu"]}
        report.figure(f"{name}: {n} examples an epoch; first epoch {rates[name]['first']:,.0f}"
                      f" ex/s ({rates[name]['first_cpu']:,.0f} per CPU-s), later epochs "
                      f"{rates[name]['later']:,.0f} ex/s ({rates[name]['later_cpu']:,.0f} "
                      "per CPU-s)")
    for kind in ("cached", "not cached"):
        a, b = rates[f"ours, {kind}"], rates[f"plain, {kind}"]
        report.figure(f"ratio ours / plain, {kind}: first epoch {a['first'] / b['first']:.2f}x,"
                      f" later epochs {a['later'] / b['later']:.2f}x wall, "
                      f"{a['later_cpu'] / b['later_cpu']:.2f}x per CPU-s "
                      f"({args.reps} reps, load {os.getloadavg()[0]:.1f})")
    a, b = rates["ours, not cached"], rates["plain, not cached"]
    for measure, key in (("wall", "later"), ("per CPU-second", "later_cpu")):
        ratio = a[key] / b[key]
        report.target(f"not cached, ours >= {LIMIT}x the tf.data guide's pipeline, {measure}",
                      ratio >= LIMIT, f"later epochs {ratio:.2f}x")
    report.finish()


if __name__ == "__main__":
    main()
