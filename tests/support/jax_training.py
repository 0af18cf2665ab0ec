"""A JAX training process for the tests: ``python -m support.jax_training SPEC OUT``,
started by ``train_in_jax``.

The tests' own process runs Keras on TensorFlow, and a process has one backend
(``training.backend``), so the JAX runs of ``tests/integration/test_jax_training.py``
train here, in a child: every run of ``SPEC`` (a JSON file: ``{"staged": {...},
"runs": {name: flat config}}``) is trained with ``training.train.fit.train``, and
``OUT`` gets, per run, the final weights (``<name>.npz``), each variable's layout as JAX
holds it at the end of training (its ``PartitionSpec`` and device count), and, for the
process, the TensorFlow modules it imported (none, the tests assert).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Trained:
    """What a child process's runs left: its report, each run's final weights, its log."""

    report: dict[str, Any]
    weights: dict[str, list[Any]]
    log: str


def train_in_jax(staged: Any, runs: dict[str, dict], out: Path, devices: int) -> Trained:
    """Train ``runs`` (flat configs by name) on ``staged`` in one JAX child process with
    ``devices`` CPU devices (``JAX_NUM_CPU_DEVICES``), writing under ``out``."""
    import numpy as np

    spec = out / "spec.json"
    spec.write_text(json.dumps({"staged": staged.to_dict(), "runs": runs}))
    proc = subprocess.run(
        [sys.executable, "-m", "support.jax_training", os.fspath(spec), os.fspath(out)],
        cwd=ROOT / "tests", capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "KERAS_BACKEND": "jax",
             "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
             # one thread a matmul: the callers compare weights bit for bit; under the
             # whole suite two runs of equal input once ended 1e-3 apart, and Eigen's
             # threaded products are the one part of the step that depends on timing
             "XLA_FLAGS": " ".join(filter(None, (os.environ.get("XLA_FLAGS"),
                                                 "--xla_cpu_multi_thread_eigen=false")))})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Trained(json.loads((out / "report.json").read_text()),
                   {name: list(np.load(out / f"{name}.npz").values()) for name in runs},
                   proc.stderr)


def main(spec_path: str, out_dir: str) -> int:
    import logging

    from training import backend

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    backend.use("jax")
    import keras
    import numpy as np

    from training.config import RunConfig
    from training.data.snapshot.staging import StagedDataset
    from training.train.fit import train

    class Layouts(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            self.found = {}
            for variable in self.model.variables:
                sharding = variable.value.sharding
                spec = getattr(sharding, "spec", ())
                self.found[variable.path] = {
                    "spec": [None if a is None else str(a) for a in spec],
                    "devices": len(sharding.device_set)}

    spec = json.loads(Path(spec_path).read_text())
    out = Path(out_dir)
    report = {}
    for name, flat in spec["runs"].items():
        layouts = Layouts()
        result = train(RunConfig.from_flat(flat), StagedDataset.from_dict(spec["staged"]),
                       extra_callbacks=[layouts])
        model = keras.saving.load_model(result.model_path, safe_mode=True)
        np.savez(out / f"{name}.npz", *model.get_weights())
        report[name] = {"result": result.to_dict(), "layouts": layouts.found}
    report["tensorflow_modules"] = sorted(
        m for m in sys.modules if m.partition(".")[0] in backend.NOT_IN_JAX)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
