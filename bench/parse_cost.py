"""Benchmark 1: DAG parse cost.

Imports each DAG file of ``dags/`` and a minimal Airflow DAG file, each in a fresh
interpreter (as the task runner does at every task start), alternating, several times;
prints the median import times, the ratio, and which heavy modules were imported.
Target: ratio <= 1.2 and no heavy module.

    .venv/bin/python bench/parse_cost.py [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _common import ROOT, Report, median, run_python

MINIMAL = '''
import pendulum
from airflow.sdk import DAG, task

with DAG(dag_id="minimal", schedule="0 3 * * *", catchup=False,
         start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    @task
    def hello():
        return 1
    hello()
'''

# Times the import of a DAG file in a fresh interpreter: everything the file pulls in
# (Airflow included) and the module's own execution. With ``preload``, Airflow's SDK is
# imported first and only the file's own cost is timed (what a task runner that already
# has Airflow loaded pays).
PROBE = '''
import importlib.util, json, sys, time
if {preload!r}:
    import airflow.sdk
start = time.perf_counter()
spec = importlib.util.spec_from_file_location("dagfile", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
elapsed = time.perf_counter() - start
heavy = [m for m in ("tensorflow", "keras", "tensorflow_datasets", "boto3") if m in sys.modules]
print(json.dumps({{"seconds": elapsed, "heavy": heavy}}))
'''


def measure(path: Path, env: dict[str, str], preload: bool = False) -> dict:
    code = PROBE.format(path=str(path), preload=preload)
    return json.loads(run_python(code, env=env).strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    report = Report("DAG parse cost")
    home = tempfile.mkdtemp(prefix="bench-airflow-")
    env = {"AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins")}
    minimal = Path(home) / "minimal_dag.py"
    minimal.write_text(MINIMAL)
    for dag_file in sorted((ROOT / "dags").glob("*.py")):
        ours, base, heavy, own, own_base = [], [], set(), [], []
        for _ in range(args.reps):
            base.append(measure(minimal, env)["seconds"])
            result = measure(dag_file, env)
            ours.append(result["seconds"])
            heavy.update(result["heavy"])
            own_base.append(measure(minimal, env, preload=True)["seconds"])
            own.append(measure(dag_file, env, preload=True)["seconds"])
        ratio = median(ours) / median(base)
        report.figure(f"{dag_file.name}: median import {median(ours) * 1000:.0f} ms vs minimal "
                      f"DAG {median(base) * 1000:.0f} ms, ratio {ratio:.2f} "
                      f"({args.reps} fresh interpreters each)")
        report.figure(f"{dag_file.name}, Airflow already imported: {median(own) * 1000:.0f} ms "
                      f"vs {median(own_base) * 1000:.0f} ms, ratio "
                      f"{median(own) / median(own_base):.2f} (the file's own cost: mostly "
                      "Airflow validating and copying the form's Params)")
        report.target(f"{dag_file.name} ratio <= 1.2", ratio <= 1.2, f"{ratio:.2f}")
        report.target(f"{dag_file.name} imports no heavy module", not heavy,
                      ", ".join(sorted(heavy)) or "none")
    report.finish()


if __name__ == "__main__":
    main()
