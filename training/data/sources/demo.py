"""Demo arrivals: the offline ``digits`` images as a team's daily partitions of PNG files.

``write_demo_partitions(out_dir)`` writes scikit-learn's 1,797 8x8 digits (scaled from
0-16 to 0-255 uint8, as ``digits.py`` does) as grayscale PNG files laid out the way a
team's labelled images land::

    <out_dir>/dt=2026-11-28/<label>/<n>.png      n: the image's index in load_digits
    <out_dir>/dt=2026-11-29/<label>/<n>.png
    <out_dir>/dt=2026-11-30/<label>/<n>.png      the drift day (3rd by default)

The images are shuffled once with ``seed``; the first ``holdout`` of them (0: none) are
written to ``<out_dir>/holdout/<label>/<n>.png`` as a pinned holdout
(``promotion.holdout_uri``) and never in a day; the rest are split evenly over the days
that are written. On ``drift_day`` (1-based) the images are inverted (a white background: the
mean pixel rises from about 78 to about 177) and the label mix is skewed: that day keeps
all its images of labels 0-4 and only one in ``DRIFT_KEEP_ONE_IN`` of labels 5-9, so a
drift check against the earlier days refuses it. ``skip_day`` (1-based) is a date with
no new data: no directory is written for it. The same call writes the same bytes (PNG
files carry no timestamp); each partition is written beside its place and swapped in
whole (``files.swap_dir``), so a re-run replaces it without a half-written moment.
"""

from __future__ import annotations

import datetime as dt
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from training.errors import ConfigError, shown
from training.files import pending_dir, swap_dir

DEMO_SEED = 20261128
DRIFT_KEPT_LABELS = frozenset(range(5))  # labels the drift day keeps in full
DRIFT_KEEP_ONE_IN = 5  # the drift day keeps one in five images of the other labels
MAX_DAYS = 366
HOLDOUT_DIR = "holdout"  # <out_dir>/holdout/<label>/<n>.png: a pinned holdout, no day's


def _day_number(field: str, value: Any, days: int) -> int | None:
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= days:
        raise ConfigError(f"{field} must be a day between 1 and days={days} (or 0 for none), "
                          f"got {shown(value)}")
    return value


def _check(start: Any, days: Any, drift_day: Any, skip_day: Any) -> tuple[dt.date, int | None,
                                                                        int | None]:
    try:
        first = dt.date.fromisoformat(start) if isinstance(start, str) else None
    except ValueError:
        first = None
    if first is None or len(start) != 10:
        raise ConfigError(f"start must be a date YYYY-MM-DD, got {shown(start)}")
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ConfigError(f"days must be between 1 and {MAX_DAYS}, got {shown(days)}")
    drift = _day_number("drift_day", drift_day, days)
    skip = _day_number("skip_day", skip_day, days)
    if skip is not None and (skip == drift or days == 1):
        raise ConfigError(f"skip_day must leave a day with data and differ from drift_day, "
                          f"got skip_day={skip} with days={days}, drift_day={drift}")
    return first, drift, skip


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")  # no tIME chunk: same bytes each time
    return buffer.getvalue()


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def _write_partition(target: Path, images: np.ndarray, labels: np.ndarray,
                     indices: np.ndarray) -> None:
    pending = pending_dir(target)
    if pending.exists():
        import shutil

        shutil.rmtree(pending)
    for index in indices:
        label_dir = pending / str(int(labels[index]))
        label_dir.mkdir(parents=True, exist_ok=True)
        (label_dir / f"{int(index):04d}.png").write_bytes(_png(images[index]))
    swap_dir(target)


def write_demo_partitions(out_dir: str | os.PathLike[str], *, start: str = "2026-11-28",
                          days: int = 3, drift_day: int | None = 3,
                          skip_day: int | None = None, holdout: int = 0,
                          seed: int = DEMO_SEED) -> dict[str, Any]:
    """Write the demo partitions (module doc) and say what was written: ``{"out_dir",
    "partitions": [{"partition", "files", "drifted", "labels"}], "skipped": [...]}``,
    and ``"holdout"`` (its directory and size) when ``holdout`` > 0."""
    first, drift, skip = _check(start, days, drift_day, skip_day)
    if isinstance(holdout, bool) or not isinstance(holdout, int) or not 0 <= holdout <= 900:
        raise ConfigError(f"holdout must be between 0 and 900 images, got {shown(holdout)}")
    images, labels = _digits()
    order = np.random.default_rng(seed).permutation(len(labels))
    pinned, order = np.sort(order[:holdout]), order[holdout:]
    numbers = [n for n in range(1, days + 1) if n != skip]
    chunks = dict(zip(numbers, np.array_split(order, len(numbers)), strict=True))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for number in range(1, days + 1):
        partition = f"dt={first + dt.timedelta(days=number - 1):%Y-%m-%d}"
        if number == skip:
            skipped.append(partition)
            continue
        chunk, day_images = chunks[number], images
        if number == drift:
            others = [i for i in chunk if labels[i] not in DRIFT_KEPT_LABELS]
            dropped = set(others) - set(others[::DRIFT_KEEP_ONE_IN])
            chunk = np.array([i for i in chunk if i not in dropped])
            day_images = 255 - images
        chunk = np.sort(chunk)
        _write_partition(out / partition, day_images, labels, chunk)
        counts = np.bincount(labels[chunk], minlength=10)
        written.append({"partition": partition, "files": len(chunk),
                        "drifted": number == drift,
                        "labels": {str(k): int(v) for k, v in enumerate(counts)}})
    result = {"out_dir": os.fspath(out.resolve()), "partitions": written, "skipped": skipped}
    if holdout:
        _write_partition(out / HOLDOUT_DIR, images, labels, pinned)
        result["holdout"] = {"dir": os.fspath((out / HOLDOUT_DIR).resolve()),
                             "files": len(pinned)}
    return result
