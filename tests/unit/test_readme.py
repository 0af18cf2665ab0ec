"""The configuration reference (docs/) is the generated one; the README's test command
is CI's."""

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
