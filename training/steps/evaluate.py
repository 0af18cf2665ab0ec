"""Step 4, evaluate: the new model against production on the same test split; the decision.

``evaluate`` scores both models (``training.metrics``; with ``promotion.holdout_uri``
also on that pinned holdout), decides (``training.registry.policy``), writes
``evaluation.json`` and the report into the model directory (so they are published with
the version) and records them as produced. Already done for this run?
``already_evaluated``: the evaluation published with the version stands (a version is
immutable), and is written back into the run directory as if made there; before
publish, the run's ``evaluation.json`` stands while everything it was made from is
unchanged (``standing_evaluation``: the model file, the data and its statistics, the
policy, the holdout setting and the production version). ``evaluated`` applies that
rule and evaluates only when it says no, the way the CLI and the Airflow task both do.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training import layout, produced
from training.config import RunConfig
from training.data.input.choose import Reader, open_reader
from training.data.snapshot import staging
from training.data.snapshot.staging import StagedDataset
from training.errors import RegistryError, shown
from training.files import sha256_file
from training.layout import model_dir
from training.locks import claim_run
from training.metrics import evaluate_model
from training.registry.loading import check_model_runs, load_keras
from training.registry.policy import PromotionPolicy, decide
from training.registry.s3 import S3Options
from training.registry.versions import ModelRegistry
from training.steps import run_dir_of

log = logging.getLogger(__name__)

TEST_BATCH = 256


def _test_split(reader: Reader, cfg: RunConfig) -> Any:
    return reader.dataset("test", global_batch_size=TEST_BATCH, shuffle=False,
                          seed=cfg.fit.seed, cache=cfg.dataset.input_cache,
                          decoded=cfg.dataset.decoded_copy)


def unplaced() -> None:
    """Evaluate on this process's default device, every example of the split: a JAX
    training process leaves its distribution set (``jax_distribution``), which would
    lay the models and the batches out over the training mesh."""
    from training import backend

    if backend.imported() == "jax":
        import keras

        keras.distribution.set_distribution(None)


def _trained(out: Path) -> dict[str, Any]:
    """What trained the run's model and how fast (``run.json``), for the Models page:
    the Keras backend (runs from before there was a choice trained on TensorFlow) and
    the median epoch's training images per second (None before runs measured it)."""
    try:
        record = json.loads((out / layout.RUN).read_text())
    except (OSError, ValueError):
        record = {}
    return {"backend": (record.get("strategy") or {}).get("backend") or "tensorflow",
            "images_per_s": (record.get("throughput") or {}).get("images_per_s")}


def _load(path: str | Path) -> Any:
    """The run's own model, loaded as every model is (``registry.loading.load_keras``)."""
    if not Path(path).is_file():
        raise RegistryError(f"the run has no trained model at {path}: train it first")
    return load_keras(path, f"the run's model {path}")


def evaluate(cfg: RunConfig, staged: StagedDataset, registry: ModelRegistry, *,
             run_dir: str | os.PathLike[str] | None = None,
             data_stats: dict[str, Any] | None = None,
             holdout_options: S3Options | None = None) -> dict[str, Any]:
    """Evaluate the new model and the production model on the same test split; decide.

    With ``promotion.holdout_uri`` both are also scored on that pinned holdout
    (``data/holdout.py``, read with ``holdout_options``), reported beside the test split.
    Writes ``evaluation.json`` into the model directory (so it is published with the
    version) and returns it. A model that is not promoted always says why.
    """
    run_dir = run_dir_of(cfg, run_dir)
    with claim_run(run_dir, cfg.run_id):
        return _evaluate(cfg, staged, registry, run_dir, data_stats, holdout_options)


def _holdout(cfg: RunConfig, reader: Reader, options: S3Options | None) -> Any:
    """The pinned holdout as a dataset and its description; (None, None) without one."""
    if not cfg.promotion.holdout_uri:
        return None, None
    from training.data.snapshot.holdout import as_dataset, load_holdout

    holdout = load_holdout(cfg.promotion.holdout_uri, options, tuple(reader.image_shape()),
                           reader.label_names())
    return as_dataset(holdout, TEST_BATCH), holdout.describe()


def _evaluate(cfg: RunConfig, staged: StagedDataset, registry: ModelRegistry,
              run_dir: Path, data_stats: dict[str, Any] | None,
              holdout_options: S3Options | None) -> dict[str, Any]:
    out = model_dir(run_dir)
    name = cfg.model_name
    published = published_evaluation(cfg, registry)
    if published is not None:
        # A re-run after publish: the version is immutable and its decision stands.
        log.info("%s %s is already published; its evaluation stands", name, cfg.run_id)
        return _restored(run_dir, published)
    if data_stats is not None:  # validate_data's, published with the version
        (out / layout.DATA_STATS).write_text(json.dumps(data_stats, indent=2) + "\n")
    staging.verify(staged)
    unplaced()
    reader = open_reader(staged)
    test = _test_split(reader, cfg)
    holdout_data, holdout = _holdout(cfg, reader, holdout_options)
    model = _load(out / layout.MODEL_FILE)
    # What promotion checks (a safe load, finite outputs), done here on the file as it
    # is published: promote then needs no Keras (``check_runs_or_evaluated``).
    model_check = {"sha256": sha256_file(out / layout.MODEL_FILE),
                   **check_model_runs(model, f"the run's model {out / layout.MODEL_FILE}")}
    challenger = evaluate_model(model, test)
    if holdout is not None:
        holdout["challenger"] = _brief(evaluate_model(model, holdout_data, "holdout"))
        holdout["champion"] = None
    champion_version = registry.production(name)
    champion = None
    if champion_version is not None:
        with tempfile.TemporaryDirectory(prefix="champion-") as tmp:
            model = registry.load_model(name, champion_version, tmp)
            champion = {"version": champion_version, **_brief(evaluate_model(model, test))}
            if holdout is not None:
                holdout["champion"] = {"version": champion_version, **_brief(
                    evaluate_model(model, holdout_data, "holdout"))}
    policy = PromotionPolicy(min_accuracy=cfg.promotion.min_accuracy,
                             min_improvement=cfg.promotion.min_improvement)
    decision = decide(challenger, champion, policy, force=cfg.promotion.force_promote,
                      champion_version=champion_version)
    evaluation = {
        "model_name": name,
        "version": cfg.run_id,
        "dataset": staged.key,
        **_trained(out),
        "model_check": model_check,
        "challenger": challenger,
        "champion": champion,
        "policy": {"min_accuracy": policy.min_accuracy,
                   "min_improvement": policy.min_improvement,
                   "force_promote": cfg.promotion.force_promote},
        "decision": decision.to_dict(),
        "holdout": holdout,
    }
    (out / layout.EVALUATION).write_text(json.dumps(evaluation, indent=2) + "\n")
    from training.report import build_report  # matplotlib: only where a report is built

    log.info("report: %s (published with the version as %s)", build_report(out),
             layout.version_key(name, cfg.run_id,
                                f"{layout.REPORT_DIR}/{layout.REPORT_INDEX}"))
    produced.record(run_dir, "evaluate", produced.EVALUATE)
    verdict = "promote" if decision.promote else "keep production"
    log.info("decision for %s %s: %s%s", name, cfg.run_id, verdict,
             " (forced)" if decision.forced else "")
    for reason in decision.reasons:
        log.info("  - %s", reason)
    return evaluation


def _restored(run_dir: Path, published: dict[str, Any]) -> dict[str, Any]:
    """The published evaluation, back in the run directory as if made there (so
    ``publish`` finds it after a lost local file), recorded as this step's output."""
    out = model_dir(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / layout.EVALUATION).write_text(json.dumps(published, indent=2) + "\n")
    produced.record(run_dir, "evaluate", produced.EVALUATE)
    return published


def standing_evaluation(cfg: RunConfig, staged: StagedDataset, registry: ModelRegistry,
                        run_dir: str | os.PathLike[str] | None = None,
                        data_stats: dict[str, Any] | None = None
                        ) -> tuple[dict[str, Any] | None, str]:
    """The run's ``evaluation.json`` if it still stands, read without TensorFlow; else
    None. It stands when it was made for this run, of the model file as it is now, on
    this staged dataset (with ``data_stats``, when given, as its statistics), with this
    policy and holdout, against the version that is in production now. Also says why
    (for the log)."""
    out = model_dir(run_dir_of(cfg, run_dir))
    try:
        evaluation = json.loads((out / layout.EVALUATION).read_text())
        model_sha256 = sha256_file(out / layout.MODEL_FILE)
    except FileNotFoundError as exc:
        return None, f"{exc.filename} does not exist"
    except (OSError, ValueError) as exc:
        return None, f"{out / layout.EVALUATION} is unreadable ({shown(exc)})"
    champion = (evaluation.get("champion") or {}).get("version")
    production = registry.production(cfg.model_name)
    expected = {"version": cfg.run_id, "dataset": staged.key,
                "policy": {"min_accuracy": cfg.promotion.min_accuracy,
                           "min_improvement": cfg.promotion.min_improvement,
                           "force_promote": cfg.promotion.force_promote}}
    for key, value in expected.items():
        if evaluation.get(key) != value:
            return None, f"it was made with {key} {evaluation.get(key)!r}, not {value!r}"
    if (evaluation.get("model_check") or {}).get("sha256") != model_sha256:
        return None, f"the model file changed since ({out / layout.MODEL_FILE})"
    if bool(evaluation.get("holdout")) != bool(cfg.promotion.holdout_uri):
        return None, "the holdout setting changed"
    if data_stats is not None and _json_or_none(out / layout.DATA_STATS) != data_stats:
        return None, f"it was made with other data statistics ({out / layout.DATA_STATS})"
    if champion != production:
        return None, (f"it was made against production version {champion}, production is "
                      f"now {production}")
    return evaluation, f"made by this run's training process against production {champion}"


def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _brief(metrics: dict[str, Any]) -> dict[str, Any]:
    """The scores two models are compared on (the per-class detail is the challenger's)."""
    return {k: metrics[k] for k in ("examples", "accuracy", "loss", "macro_f1")}


def read_evaluation(cfg: RunConfig, run_dir: str | os.PathLike[str] | None = None
                    ) -> dict[str, Any]:
    path = model_dir(run_dir_of(cfg, run_dir)) / layout.EVALUATION
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RegistryError(f"run {cfg.run_id} has no evaluation ({path}): evaluate it "
                            "before publishing") from None
    except (OSError, ValueError) as exc:
        raise RegistryError(f"the evaluation of run {cfg.run_id} ({path}) is unreadable "
                            f"({shown(exc)}): evaluate it again") from None


def published_evaluation(cfg: RunConfig, registry: ModelRegistry,
                         version: str | None = None) -> dict[str, Any] | None:
    """The evaluation published with ``version`` (default: this run's), or None before
    publish."""
    version = version or cfg.run_id
    try:
        registry.show(cfg.model_name, version)
    except RegistryError:
        return None
    key = layout.version_key(cfg.model_name, version, layout.EVALUATION)
    return json.loads(registry.store.get_bytes(key))


def already_evaluated(cfg: RunConfig, staged: StagedDataset, registry: ModelRegistry,
                      run_dir: str | os.PathLike[str] | None = None,
                      data_stats: dict[str, Any] | None = None
                      ) -> tuple[dict[str, Any] | None, str]:
    """This step's "already done?" rule: (the evaluation that stands, why) or (None,
    why it must be made again). Reads JSON only: no TensorFlow. A published evaluation
    is written back into the run directory (``_restored``)."""
    published = published_evaluation(cfg, registry)
    if published is not None:
        return _restored(run_dir_of(cfg, run_dir), published), (
            f"{cfg.model_name} {cfg.run_id} is already published; its evaluation stands")
    return standing_evaluation(cfg, staged, registry, run_dir, data_stats)


def evaluated(cfg: RunConfig, staged: StagedDataset, registry: ModelRegistry, *,
              run_dir: str | os.PathLike[str] | None = None,
              data_stats: dict[str, Any] | None = None,
              evaluate_now: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The run's evaluation: the one that stands (``already_evaluated``), else what
    ``evaluate_now`` makes (``evaluate`` in this process, or in a child process for an
    Airflow task, which never loads TensorFlow itself)."""
    evaluation, why = already_evaluated(cfg, staged, registry, run_dir, data_stats)
    if evaluation is not None:
        log.info("the evaluation stands: %s", why)
        return evaluation
    log.info("evaluating: %s", why)
    return evaluate_now()
