"""The configuration reference (docs/) is the generated one; the README's test command
is CI's."""

import itertools
from pathlib import Path

from training.cli import markdown_table
from training.config import flat_fields

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
AIRFLOW = (ROOT / "docs" / "airflow.md").read_text()


def test_the_configuration_reference_is_the_generated_one():
    table = markdown_table()
    assert table in CONFIGURATION, "regenerate it: python -m training schema --markdown"
    assert all(f"| `{s.key}` |" in table for s in flat_fields())


def test_ci_runs_the_readme_test_command():
    assert "./dev test" in README
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()


def test_the_form_table_is_the_generated_one():
    from training_airflow.params import form_markdown

    assert form_markdown() in AIRFLOW, "regenerate it: python -m training_airflow.params"


def _walk_through() -> list[Path]:
    """The files the README's trigger walk-through names, in order (each numbered
    item's first path)."""
    import re

    section = README.split("## One trigger", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. \*\*`([^`]+)`\*\*", section, flags=re.M)
    return [ROOT / item for item in items]


def _reaches(source: Path, target: Path) -> bool:
    """Whether ``source`` calls into ``target``: imports its module (anywhere in the
    file), or starts it as ``python -m training`` (whose ``__main__`` runs the CLI)."""
    import ast

    tree = ast.parse(source.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
    parts = target.relative_to(ROOT).with_suffix("").parts
    module = ".".join(parts[1:] if parts[0] == "plugins" else parts)
    if module in imported:
        return True
    starts_cli = '"-m", "training"' in source.read_text()
    return starts_cli and target == ROOT / "training" / "cli.py"


def test_the_trigger_walk_through_names_six_files_that_call_each_other_in_order():
    files = _walk_through()
    assert 1 < len(files) <= 6, files
    assert all(path.is_file() for path in files), files
    assert files[0].name == "params.py" and "model.fit(" in files[-1].read_text()
    for source, target in itertools.pairwise(files):
        # params.py is called by the next file (the operators build the config with it);
        # from there on each file calls the next.
        caller, callee = (target, source) if source == files[0] else (source, target)
        assert _reaches(caller, callee), f"{caller.name} does not call into {callee}"
