"""Counting how often one config field is checked, in this process and its children.

``FieldChecks("fit.epochs", tmp_path, monkeypatch)`` wraps ``training.config.schema
.check_value`` here, and puts a ``sitecustomize`` on ``PYTHONPATH`` that wraps it the
same way in every Python child started after it (the tasks' ``python -m training``
processes inherit the environment). Each check of the field appends the checking
process's id to a file; ``per_process()`` counts them.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

FILE_VAR, FIELD_VAR = "TRAINING_TEST_CHECKS_FILE", "TRAINING_TEST_CHECKS_FIELD"

SITECUSTOMIZE = f'''
import os


def _count_checks():
    from training.config import schema

    original, record = schema.check_value, os.environ["{FILE_VAR}"]

    def counting(section, f, value):
        if f"{{section}}.{{f.name}}" == os.environ["{FIELD_VAR}"]:
            with open(record, "a") as out:
                out.write(f"{{os.getpid()}}\\n")
        return original(section, f, value)

    schema.check_value = counting


if os.environ.get("{FILE_VAR}"):
    _count_checks()
'''


class FieldChecks:
    def __init__(self, field: str, tmp_path: Path, monkeypatch) -> None:
        site = tmp_path / "count-checks"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.record = tmp_path / "checks.txt"
        self.record.write_text("")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p))
        monkeypatch.setenv(FILE_VAR, str(self.record))
        monkeypatch.setenv(FIELD_VAR, field)
        from training.config import schema

        original = schema.check_value

        def counting(section, f, value):
            if f"{section}.{f.name}" == field:
                with open(self.record, "a") as out:
                    out.write(f"{os.getpid()}\n")
            return original(section, f, value)

        monkeypatch.setattr(schema, "check_value", counting)

    def per_process(self) -> Counter:
        """{process id: checks of the field in it}."""
        return Counter(self.record.read_text().split())
