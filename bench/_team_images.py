"""A team's own labelled images for the staging benches, generated offline.

Day ``n`` (1-based, from ``START``) is the partition ``dt=YYYY-MM-DD/<label>/<k>.png``:
``per_day`` distinct 28x28x1 PNGs, 10 labels (scikit-learn's digits, scaled up, with
noise drawn per image: every file has bytes of its own), landed with
``training.data.sources.landing.land`` (the files, then ``_SUCCESS`` last). The same day gives
the same bytes on every run, so landing it again is a no-op.

``cached_directory_store`` keeps a directory store of landed days in the temporary
directory between runs (``bench-team-images-<per_day>``): generating and landing 60
days of 600 images takes about a minute, once.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

START = dt.date(2026, 1, 1)
SHAPE = "28x28x1"
SEED = 27


def day(n: int) -> str:
    """The date of day ``n`` (1-based), YYYY-MM-DD."""
    return (START + dt.timedelta(days=n - 1)).isoformat()


def partition(n: int) -> str:
    return f"dt={day(n)}"


def _digits() -> tuple[Any, Any]:
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    # 8x8 -> 32x32 blocks, cropped to 28x28, 0-255
    images = np.kron(digits.images * (255.0 / 16.0), np.ones((1, 4, 4)))[:, 2:30, 2:30]
    return images, digits.target


def write_day(source_root: Path, n: int, per_day: int) -> Path:
    """Day ``n``'s PNGs under ``source_root/<partition>/<label>/``; that directory."""
    import numpy as np
    from PIL import Image

    images, labels = _digits()
    rng = np.random.default_rng([SEED, n])
    picks = rng.integers(0, len(labels), per_day)
    noisy = images[picks] + rng.normal(0, 12, (per_day, 28, 28))
    noisy = np.clip(noisy, 0, 255).astype(np.uint8)
    root = source_root / partition(n)
    for k, (image, index) in enumerate(zip(noisy, picks, strict=True)):
        label_dir = root / str(int(labels[index]))
        label_dir.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        (label_dir / f"{n:03d}-{k:05d}.png").write_bytes(buffer.getvalue())
    return root


def land_days(data_uri: str, days: range, per_day: int, store_options: Any = None) -> int:
    """Land each day of ``days`` that has not landed yet; how many were landed now."""
    from training.data.sources.landing import land, read_marker
    from training.registry import open_store

    store = open_store(data_uri, store_options)
    landed = 0
    for n in days:
        if read_marker(store, partition(n)) is not None:
            continue
        source = Path(tempfile.mkdtemp(prefix="bench-team-source-"))
        try:
            write_day(source, n, per_day)
            land(source, data_uri, partition(n), store_options=store_options)
        finally:
            shutil.rmtree(source)
        landed += 1
    return landed


def cached_directory_store(days: int, per_day: int) -> str:
    """A directory store with days 1..``days`` landed, kept between runs."""
    root = Path(tempfile.gettempdir()) / f"bench-team-images-{per_day}" / "store"
    root.mkdir(parents=True, exist_ok=True)
    land_days(os.fspath(root), range(1, days + 1), per_day)
    return os.fspath(root)
