"""What each step produced in a run's model directory, so that publish uploads exactly that.

``train`` and ``evaluate`` each record the files they wrote under ``model/`` (a named
directory stands for every file in it) in the run directory's ``produced.json``, beside
``model/`` rather than in it: ``{"train": [...], "evaluate": [...]}``, relative POSIX
paths, replaced atomically. ``publish`` uploads the union and nothing else; a file
nobody recorded (a stray download, a notebook's output) is left out and named in the
log, and a recorded file that is gone stops the publish.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from training import layout
from training.errors import RegistryError
from training.layout import PRODUCED, model_dir

log = logging.getLogger(__name__)

# What each step writes under model/ (training.train.fit, training.steps.evaluate).
TRAIN = (layout.CONFIG, layout.RUN, layout.HISTORY_CSV, layout.TENSORBOARD_DIR, layout.HISTORY,
         layout.MODEL_FILE, layout.SAVED_MODEL_DIR, layout.TRAINED)
EVALUATE = (layout.EVALUATION, layout.DATA_STATS, layout.REPORT_DIR)


def _files(root: Path, names: Iterable[str]) -> list[str]:
    found = []
    for name in names:
        path = root / name
        if path.is_dir():
            found += [p.relative_to(root).as_posix() for p in path.rglob("*") if p.is_file()]
        elif path.is_file():
            found.append(Path(name).as_posix())
    return sorted(found)


def read(run_dir: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Every step's record of the run (empty before any)."""
    path = Path(run_dir) / PRODUCED
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def record(run_dir: str | os.PathLike[str], step: str, names: Iterable[str]) -> list[str]:
    """Record the files of ``names`` (files or directories under ``model/``) as what
    ``step`` produced, replacing that step's earlier record; the files recorded."""
    run_dir = Path(run_dir)
    files = _files(model_dir(run_dir), names)
    records = {**read(run_dir), step: files}
    path = run_dir / PRODUCED
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return files


def to_publish(run_dir: str | os.PathLike[str]) -> list[str]:
    """The files every step recorded: what publish uploads. The files under ``model/``
    that no step recorded are named in a WARNING and left out; a recorded file that is
    gone, or a run with no record at all, is a RegistryError."""
    run_dir = Path(run_dir)
    records = read(run_dir)
    if not records:
        raise RegistryError(f"{run_dir / PRODUCED} is missing: no step recorded what it "
                            "produced in this run; train (and evaluate) it again")
    recorded = sorted({f for files in records.values() for f in files})
    root = model_dir(run_dir)
    missing = [f for f in recorded if not (root / f).is_file()]
    if missing:
        raise RegistryError(f"{len(missing)} file(s) the steps recorded are gone from "
                            f"{root}: {', '.join(missing[:5])}; train the run again")
    present = _files(root, [p.name for p in root.iterdir()])
    stray = [f for f in present if f not in set(recorded)]
    if stray:
        sizes = ", ".join(f"{f} ({(root / f).stat().st_size / 2**20:.1f} MiB)"
                          for f in stray[:10])
        log.warning("left out of the version, produced by no step: %s%s", sizes,
                    f" and {len(stray) - 10} more" if len(stray) > 10 else "")
    return recorded
