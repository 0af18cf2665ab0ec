"""The pipeline's steps after training: evaluate against production, publish, promote.

Each function is one step that the CLI (``python -m training run``) and the Airflow
DAG call the same way. Inputs and outputs are small dicts and paths, never models,
so they travel through XCom. A step re-run for the same run gives the same result:

* ``evaluate`` re-evaluates both models and rewrites ``evaluation.json``;
* ``publish`` uploads what the steps recorded of the run's ``model/`` (``produced``) as
  version ``<run_id>``; identical bytes are a no-op, so a retry completes an
  interrupted upload;
* ``promote`` is a no-op when the version is already in production.

Just over 300 lines, on purpose until the steps get modules of their own: the three
steps share the run directory's reading and the published evaluation.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from training import layout, produced
from training.config import RunConfig
from training.data import staging
from training.data.input import load_builder, make_dataset
from training.data.staging import StagedDataset
from training.errors import RegistryError, shown
from training.evaluate import evaluate_model
from training.files import sha256_file
from training.layout import model_dir
from training.locks import claim_run
from training.registry import open_store
from training.registry.loading import check_model_runs, load_keras
from training.registry.policy import PromotionPolicy, decide
from training.registry.s3 import S3Options
from training.registry.versions import ModelRegistry

log = logging.getLogger(__name__)

TEST_BATCH = 256


def open_registry(cfg: RunConfig, options: S3Options | None = None) -> ModelRegistry:
    """The registry on the configured store (S3 options from the caller or boto3's chain)."""
    return ModelRegistry(open_store(cfg.storage.store_uri, options))


def _test_split(builder: Any, cfg: RunConfig) -> Any:
    return make_dataset(builder, "test", global_batch_size=TEST_BATCH, shuffle=False,
                        seed=cfg.fit.seed, cache=cfg.dataset.input_cache)


def _load(path: str | Path) -> Any:
    """The run's own model, loaded as every model is (``registry.loading.load_keras``)."""
    if not Path(path).is_file():
        raise RegistryError(f"the run has no trained model at {path}: train it first")
    return load_keras(path, f"the run's model {path}")


def _run_dir(cfg: RunConfig, run_dir: str | os.PathLike[str] | None) -> Path:
    """The run directory a step works on: the one the step before reported (Airflow
    passes ``train``'s), or, called without one, the config's own (the CLI)."""
    return Path(run_dir) if run_dir is not None else cfg.run_dir()


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
    run_dir = _run_dir(cfg, run_dir)
    with claim_run(run_dir, cfg.run_id):
        return _evaluate(cfg, staged, registry, run_dir, data_stats, holdout_options)


def _holdout(cfg: RunConfig, builder: Any, options: S3Options | None) -> Any:
    """The pinned holdout as a dataset and its description; (None, None) without one."""
    if not cfg.promotion.holdout_uri:
        return None, None
    from training.data.holdout import as_dataset, load_holdout
    from training.data.statistics import label_names

    image = builder.info.features[(builder.info.supervised_keys or ("image",))[0]]
    holdout = load_holdout(cfg.promotion.holdout_uri, options, tuple(image.shape),
                           label_names(builder))
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
        (out / layout.EVALUATION).write_text(json.dumps(published, indent=2) + "\n")
        produced.record(run_dir, "evaluate", produced.EVALUATE)
        return published
    if data_stats is not None:  # validate_data's, published with the version
        (out / layout.DATA_STATS).write_text(json.dumps(data_stats, indent=2) + "\n")
    staging.verify(staged)
    builder = load_builder(staged)
    test = _test_split(builder, cfg)
    holdout_data, holdout = _holdout(cfg, builder, holdout_options)
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


def standing_evaluation(cfg: RunConfig, staged: StagedDataset, registry: ModelRegistry,
                        run_dir: str | os.PathLike[str] | None = None
                        ) -> tuple[dict[str, Any] | None, str]:
    """The run's ``evaluation.json`` if it still stands, read without TensorFlow; else
    None. It stands when it was made for this run, of the model file as it is now, on
    this staged dataset, with this policy and holdout, against the version that is in
    production now. Also says why (for the log)."""
    out = model_dir(_run_dir(cfg, run_dir))
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
    if champion != production:
        return None, (f"it was made against production version {champion}, production is "
                      f"now {production}")
    return evaluation, f"made by this run's training process against production {champion}"


def _brief(metrics: dict[str, Any]) -> dict[str, Any]:
    """The scores two models are compared on (the per-class detail is the challenger's)."""
    return {k: metrics[k] for k in ("examples", "accuracy", "loss", "macro_f1")}


def read_evaluation(cfg: RunConfig, run_dir: str | os.PathLike[str] | None = None
                    ) -> dict[str, Any]:
    path = model_dir(_run_dir(cfg, run_dir)) / layout.EVALUATION
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


def publish(cfg: RunConfig, registry: ModelRegistry, *, created: str,
            source: dict[str, str] | None = None,
            run_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Upload what the run's steps recorded (``produced``) as version ``cfg.run_id``.

    ``created`` comes from the caller (the Airflow run's date, or the time training
    started), never the clock at upload, so a retry writes the same manifest.
    ``source`` names what produced the version (the Airflow DAG run and its URL).
    """
    run_dir = _run_dir(cfg, run_dir)
    with claim_run(run_dir, cfg.run_id):
        evaluation = read_evaluation(cfg, run_dir)
        metrics = {k: evaluation["challenger"][k] for k in ("accuracy", "loss", "macro_f1")}
        manifest = registry.publish(cfg.model_name, cfg.run_id, model_dir(run_dir),
                                    run_id=cfg.run_id, created=created, metrics=metrics,
                                    source=source, max_bytes=cfg.storage.max_version_mb << 20,
                                    only=produced.to_publish(run_dir))
    summary = {"model_name": cfg.model_name, "version": cfg.run_id,
               "store_uri": cfg.storage.store_uri, "files": len(manifest["files"]),
               "metrics": manifest["metrics"]}
    log.info("published %s version %s (%d files) to %s", cfg.model_name, cfg.run_id,
             summary["files"], cfg.storage.store_uri)
    return summary


def promote(cfg: RunConfig, registry: ModelRegistry, *, at: str,
            published: dict[str, Any] | None = None) -> dict[str, Any]:
    """Move the production pointer to the published version when the decision says so.

    ``published`` is what ``publish`` returned (Airflow hands it over through XCom);
    without it, this run's version. Returns ``{"promoted": bool, "reasons": [...],
    ...}``; the pointer only moves if production is still the champion the decision was
    made against.
    """
    name, version = cfg.model_name, cfg.run_id
    if published is not None:
        if published.get("model_name") != name:
            raise RegistryError(f"publish handed over model {published.get('model_name')!r}, "
                                f"but this run's model is {name!r}")
        version = published["version"]
    # The decision published with the version, not a local file that may have changed.
    evaluation = published_evaluation(cfg, registry, version)
    if evaluation is None:
        raise RegistryError(f"model {name!r} version {version!r} is not "
                            "published: publish it before promoting")
    decision = evaluation["decision"]
    result = {"model_name": name, "version": version,
              "promoted": False, "forced": decision["forced"], "reasons": decision["reasons"]}
    if not decision["promote"]:
        log.info("%s %s is not promoted: %s", name, version, "; ".join(decision["reasons"]))
        return result
    champion = evaluation["champion"]
    registry.promote(name, version, run_id=cfg.run_id, at=at,
                     reason="; ".join(decision["reasons"]), forced=decision["forced"],
                     expected_current=champion["version"] if champion else None)
    log.info("%s %s is now in production", name, version)
    return {**result, "promoted": True}


def started_at(cfg: RunConfig) -> str:
    """When the run's training started, as recorded in ``run.json`` (ISO 8601)."""
    path = model_dir(cfg.run_dir()) / layout.RUN
    try:
        return json.loads(path.read_text())["started_at"]
    except (OSError, ValueError, KeyError) as exc:
        raise RegistryError(f"run {cfg.run_id} has no readable {path} ({shown(exc)}): train "
                            "it before publishing") from None


def artifact_paths(cfg: RunConfig) -> dict[str, str]:
    out = model_dir(cfg.run_dir())
    return {"model": os.fspath(out / layout.MODEL_FILE),
            "evaluation": os.fspath(out / layout.EVALUATION)}
