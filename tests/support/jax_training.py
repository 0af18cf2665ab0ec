"""A JAX training process for the tests: ``python -m support.jax_training SPEC OUT``.

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
import sys
from pathlib import Path


def main(spec_path: str, out_dir: str) -> int:
    import logging

    from training import backend

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    backend.use("jax")
    import keras
    import numpy as np

    from training.config import RunConfig
    from training.data.staging import StagedDataset
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
