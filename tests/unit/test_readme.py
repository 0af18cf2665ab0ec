"""The README's configuration reference and set-up commands stay true."""

from pathlib import Path

from training.config import flat_fields

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_every_config_key_is_in_the_readme_reference():
    missing = [s.key for s in flat_fields() if f"| `{s.key}` | {s.path} |" not in README]
    assert not missing, f"README configuration reference lacks {missing}"


def test_ci_runs_the_readme_test_command():
    assert "./dev test" in README
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()
