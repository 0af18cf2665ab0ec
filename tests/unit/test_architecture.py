"""The layout keeps its promises: no import circles, no Airflow in the library, short
modules (or a reason at the top of a long one), none over 400 lines, the process
environment read only where a deployment or a process contract is read, and the data
rooms (``training/data/``: sources, snapshot, input) importing only downward, each saying
what enters and what leaves, with one module that asks which kind of reader it holds."""

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


# Who may read the process environment (os.environ, os.getenv). Settings of the
# deployment are read by ``training.deployment`` alone, and the CLI entry reads its own
# switches; the rest are contracts between processes, not settings: what a launcher
# hands a worker, what the platform hands a pod.
ENVIRONMENT_READERS = {
    "training/deployment.py": "the deployment's settings (TRAINING_*)",
    "training/entry.py": "the CLI entry (TRAINING_TRACEBACK, TensorFlow's log level)",
    "training/train/cluster.py": "TF_CONFIG, tf.distribute's contract with each worker",
    "training/train/strategy.py": "TPU_NAME, set by a TPU VM",
    "training/launch/kubernetes/pod.py": "the Job's pod: its index and service, set by "
                                         "Kubernetes and the rendered Job",
    "training/launch/local.py": "the workers inherit the launcher's environment",
    "training/locks.py": "the run claims a parent hands its child (TRAINING_CLAIMS_HELD)",
    "training/train/keras_patches/__init__.py": "TRAINING_KERAS_COMPAT, a worker's switch "
                                                "for the patches",
    "training/launch/command.py": "a step's child inherits the task's environment",
    "training/backend.py": "KERAS_BACKEND, Keras's contract with each process",
    "training/tracking/sender.py": "MLflow's client reads its HTTP retries and "
                                   "timeout (MLFLOW_HTTP_REQUEST_*) there",
    "training/tracking/sender_pipe.py": "the sender process inherits the tracked "
                                        "process's environment",
    "plugins/training_airflow/preflight.py": "the checks are of the environment itself",
}


def _reads_environment(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "os" and node.attr in ("environ", "getenv", "environb")):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv") for a in node.names):
            return True
    return False


def test_only_the_deployment_and_process_contracts_read_the_environment():
    paths = [*(ROOT / "training").rglob("*.py"), *(ROOT / "plugins").rglob("*.py"),
             *(ROOT / "dags").glob("*.py")]
    readers = {str(p.relative_to(ROOT)) for p in paths if _reads_environment(p)}
    assert readers - set(ENVIRONMENT_READERS) == set(), (
        "read the deployment's settings through training.deployment.Deployment, or add "
        "the module to ENVIRONMENT_READERS with the contract it reads")
    assert set(ENVIRONMENT_READERS) - readers == set(), "no longer reads: take it out"


def test_the_environment_check_sees_each_way_of_reading(tmp_path):
    for source in ("import os\nos.environ['X']", "import os\nos.getenv('X')",
                   "from os import environ\n", "import os\ndict(os.environ)"):
        (tmp_path / "m.py").write_text(source)
        assert _reads_environment(tmp_path / "m.py"), source
    (tmp_path / "m.py").write_text("import os\nos.path.join('a')\nenv = {}\nenv.get('X')")
    assert not _reads_environment(tmp_path / "m.py")


# The data rooms, in a dataset's order: a room imports only the rooms before it (and
# what lies below them all: ``training/data/manifest.py``).
DATA = ROOT / "training" / "data"
ROOMS = ("sources", "snapshot", "input")


def _room(module: str) -> int | None:
    """A module's place among the data rooms: 0 below them, 1.. each room; None outside."""
    if module != "training.data" and not module.startswith("training.data."):
        return None
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    return ROOMS.index(part) + 1 if part in ROOMS else 0


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, what it imports) for every import of a later data room, or of any room
    from below them."""
    return sorted((module, dep) for module, deps in graph.items()
                  if (rank := _room(module)) is not None for dep in deps
                  if (other := _room(dep)) is not None and other > rank)


def test_the_data_is_in_rooms_each_saying_what_enters_and_what_leaves():
    assert {p.name for p in DATA.iterdir() if (p / "__init__.py").is_file()} == set(ROOMS)
    assert {p.name for p in DATA.glob("*.py")} == {"__init__.py", "manifest.py"}, (
        "a data module belongs in a room: sources, snapshot or input (training/data/__init__)")
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((DATA / room / "__init__.py").read_text())) or ""
        for word in ("Enters:", "Leaves:"):
            said = doc.partition(word)[2].split("\n\n")[0]
            assert len(said.split()) >= 8, f"training/data/{room}/__init__.py: say {word}"
    for path in DATA.rglob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert doc.strip(), f"{path.relative_to(ROOT)}: its first line says why it exists"


def test_the_data_rooms_import_only_downward():
    assert _upward(_graph()) == []


def test_the_downward_check_finds_an_upward_import():
    graph = {"training.data.sources.a": {"training.data.input.b", "training.data.manifest"},
             "training.data.input.b": {"training.data.snapshot.c", "training.errors"},
             "training.data.manifest": {"training.data.snapshot.c"},
             "training.steps.train": {"training.data.input.b"}}
    assert _upward(graph) == [("training.data.manifest", "training.data.snapshot.c"),
                              ("training.data.sources.a", "training.data.input.b")]


# Which kind of reader a module holds is asked in one place (``choose.py``, as Keras's
# ``get_data_adapter``): an attribute only some readers have, or a reader's class.
KIND_DECIDER = "training.data.input.choose"
READER_ATTRIBUTES = {"as_dataset", "num_examples", "undecoded", "decode", "arrays",
                     "encoded", "iter_encoded", "dataset_info", "label_names",
                     "image_shape", "device_split", "data_dir", "images", "tf_records"}
READER_CLASSES = {"StagedArrays", "StagedInfo", "SnapshotReader", "TfReader",
                  "SnapshotTfReader", "NumpyReader", "DecodedSplit", "DeviceSplit",
                  "IndexBatches", "SplitBatches", "DatasetBuilder"}


def _kind_checks(source: str) -> list[str]:
    """The places in ``source`` that ask which kind of reader a value is."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        name, args = node.func.id, node.args
        if name in ("hasattr", "getattr") and len(args) >= 2 and (
                name == "hasattr" or len(args) == 3) and isinstance(args[1], ast.Constant) \
                and args[1].value in READER_ATTRIBUTES:
            found.append(f"line {node.lineno}: {name}(..., {args[1].value!r})")
        elif name == "isinstance" and len(args) == 2 and {
                n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)
                for n in ast.walk(args[1])} & READER_CLASSES:
            found.append(f"line {node.lineno}: isinstance(..., {ast.unparse(args[1])})")
    return found


def test_only_the_input_decision_asks_which_kind_of_reader_it_holds():
    asking = {module: found for module, path in _modules().items()
              if module != KIND_DECIDER and (found := _kind_checks(path.read_text()))}
    assert asking == {}, ("ask the reader (training.data.input.choose.Reader), or decide "
                          "the kind in choose.reader_for")
    assert _kind_checks(_modules()[KIND_DECIDER].read_text())  # the decision is there


def test_the_kind_check_sees_each_way_of_asking():
    for source in ("hasattr(builder, 'as_dataset')", "getattr(ds, 'device_split', None)",
                   "isinstance(builder, StagedArrays)",
                   "isinstance(b, (int, staged_arrays.StagedArrays))"):
        assert _kind_checks(source), source
    for source in ("getattr(args, 'images')", "hasattr(args, 'epochs')",
                   "isinstance(value, dict)"):
        assert not _kind_checks(source), source
