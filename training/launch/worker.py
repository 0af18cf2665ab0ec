"""One worker of a local multi-worker run: ``python -m training.launch.worker``.

``training.launch.local.run`` starts one of these per worker, with ``TF_CONFIG`` naming
the cluster and this worker's index (``training.train.cluster``). The worker applies the
Keras 3 multi-worker patches (``training.train.keras_patches``), trains with
``fit.train`` (which builds the MultiWorkerMirroredStrategy; worker 0, the chief, alone
writes the run directory) and then prints, for the launcher to read:

* ``final weights digest sha256:<hex>``: the weights at the end of training
  (``WeightsReport``); the launcher fails the run when the workers' digests differ;
* ``{"trained": {...}}``: the ``TrainResult``, last.

With ``--report-dir`` it also writes ``worker-<index>.json`` there (digest and
per-epoch logs), so a person or a test can compare the workers epoch by epoch.

``train_reporting`` (train with the ``WeightsReport``, print the digest) is also what
``python -m training train`` runs as a worker of a cluster (``TF_CONFIG`` set: a pod of
the Kubernetes Job), so every worker, however started, prints its digest the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.config import RunConfig
from training.entry import run_command
from training.errors import ConfigError
from training.train import cluster

if TYPE_CHECKING:
    from training.data.snapshot.staging import StagedDataset
    from training.train.fit import TrainResult

DIGEST_MARK = "final weights digest sha256:"
TRAINED_PREFIX = '{"trained"'  # the line that carries the TrainResult


def report_path(report_dir: str | Path, index: int) -> Path:
    """The report file of worker ``index`` in ``report_dir``."""
    return Path(report_dir) / f"worker-{index}.json"


def train_reporting(cfg: RunConfig, staged: StagedDataset,
                    report_dir: str | Path | None = None, *,
                    callbacks: Sequence[Any] = ()) -> TrainResult:
    """Train this worker's part of a multi-worker run (``TF_CONFIG`` set) with a
    ``WeightsReport``; print ``DIGEST_MARK`` and the final weights digest.

    Nothing is printed when the run was already trained (nothing ran). With
    ``report_dir`` the report is also written to ``report_path(report_dir, index)``.
    ``callbacks`` join fit (the chief's per-epoch tracking).
    """
    from training.train import fit, keras_patches
    from training.train.callbacks.weights_report import WeightsReport

    tf_config = cluster.current()
    if not tf_config:
        raise ConfigError("a worker of a multi-worker run needs TF_CONFIG; start it with "
                          "training.launch.local.run() or in a pod of the Kubernetes Job")
    index = cluster.task_index(tf_config)
    report = WeightsReport(None if report_dir is None else report_path(report_dir, index),
                           index=index)
    # fit.train builds the MultiWorkerMirroredStrategy; the patches only act once the
    # strategy is in multi-worker mode, so installing them first is safe (and
    # keras_patches.install_for(strategy) inside fit.train then adds only the rest).
    if cfg.runtime.backend == "tensorflow":
        keras_patches.enable()
    result = fit.train(cfg, staged, extra_callbacks=[report, *callbacks])
    if report.digest is not None:  # None: the run was already trained, nothing ran
        print(f"{DIGEST_MARK}{report.digest}", flush=True)
    return result


def work(config: str, staged: str, report_dir: str | None) -> int:
    """Train this worker's part; print the digest and the result for the launcher."""
    from training import backend
    from training.data.snapshot.staging import StagedDataset
    from training.run_extras import tracking_callbacks
    from training.tracking import tracker_from_env

    cfg = RunConfig.from_file(config)
    backend.use(cfg.runtime.backend)  # before anything imports Keras
    result = train_reporting(cfg, StagedDataset.read(staged), report_dir,
                             callbacks=tracking_callbacks(tracker_from_env(), cfg))
    print(json.dumps({"trained": result.to_dict()}), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.launch.worker",
                                     description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--config", required=True, help="the run's config.json")
    parser.add_argument("--staged", required=True, help="the staged dataset, as JSON")
    parser.add_argument("--report-dir", help="write worker-<index>.json here at the end")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(lambda: work(args.config, args.staged, args.report_dir))


if __name__ == "__main__":
    sys.exit(main())
