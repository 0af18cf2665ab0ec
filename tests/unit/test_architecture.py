"""The layout keeps its promises: no import circles, no Airflow in the library, short
modules (or a reason at the top of a long one), none over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"training": ROOT / "training", "training_airflow": ROOT / "plugins/training_airflow",
            "tools": ROOT / "tools"}
LONG = 300
MAX_LINES = 400  # the house rule: one idea per module, none longer than this


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):  # function-level imports too
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        deps = {owner(n) for n in _imports(path)} - {None, module}
        # a module importing its own package's __init__ is not a circle between ideas
        graph[module] = {d for d in deps if not module.startswith(d + ".")}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    circles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for dep in sorted(graph[module]):
            if dep in path:
                circles.append(path[path.index(dep):] + [dep])
            elif dep not in done:
                visit(dep, [*path, dep])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return circles


def test_no_module_imports_itself_back_through_another():
    assert _circles(_graph()) == []


def test_the_circle_check_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_library_imports_no_airflow():
    for module, path in _modules().items():
        if module.startswith("training."):
            assert not {n for n in _imports(path) if n.split(".")[0] == "airflow"}, module


def test_a_long_module_says_at_its_top_why():
    for path in _modules().values():
        lines = path.read_text().splitlines()
        if len(lines) > LONG:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "lines" in doc and ("why" in doc.lower() or "on purpose" in doc), (
                f"{path.relative_to(ROOT)} has {len(lines)} lines: split it, or say at its "
                "top why it is one idea")


def test_no_module_is_over_400_lines():
    """The product, its plugin, the local tooling and the DAG files."""
    paths = [*_modules().values(), *(ROOT / "dags").glob("*.py"),
             *(ROOT / "plugins").rglob("*.py")]
    over = {str(p.relative_to(ROOT)): n for p in set(paths)
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not over, f"split these modules (over {MAX_LINES} lines): {over}"
