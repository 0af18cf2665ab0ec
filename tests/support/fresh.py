"""A fresh clone of the working tree and a new user's environment, for the journeys.

The README's commands are run by tests exactly as written: in a copy of the tree as a
clone of it would be (the tracked files and the untracked ones git does not ignore; no
``.venv``, ``.airflow`` or ``var``), with the environment a person has who just cloned
it (no variable and no PATH entry that the README does not mention).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Set by the test session or by an activated virtual environment, never by the README.
_FOREIGN_PREFIXES = ("AIRFLOW", "_AIRFLOW", "TRAINING_", "AWS_", "TF_", "PYTHON", "VIRTUAL_ENV",
                     "PYTEST_")


def new_user_env() -> dict[str, str]:
    """This process's environment as a new user's shell would have it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
    path = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep)
            if p and not (Path(p).parent / "pyvenv.cfg").exists()]
    env["PATH"] = os.pathsep.join(path)
    return env


def fresh_copy(dest: Path) -> Path:
    """The working tree as a clone of it would be (git's files, nothing ignored)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    dest.mkdir(parents=True)
    for rel in filter(None, listed):
        source = REPO / rel
        if source.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def artifacts_dir() -> Path:
    path = Path(os.environ.get("TEST_ARTIFACTS_DIR") or REPO / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path
