"""``python -m training <command>``: one command per step of the pipeline (``training.steps``).

Every config field is a flag (``--epochs``, ``--batch-size``, ...), generated from the
config schema; ``--config FILE`` reads a JSON config first and flags override it. The
config is fully validated, the dataset and model names included, before anything is
written. Failures exit non-zero with one line: ``error: <what, the value, what is
allowed>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from training import backend, layout
from training import run_extras as extras
from training.config import SECTIONS, FieldSpec, RunConfig, flat_fields, json_schema
from training.deployment import tracking_uri_from_env
from training.entry import run_command
from training.errors import ConfigError
from training.locks import claim_run
from training.train import cluster

log = logging.getLogger("training")


def _add_config_flags(parser: argparse.ArgumentParser, staged: bool = True) -> None:
    parser.add_argument("--config", metavar="FILE", help="JSON config file (nested by section)")
    if staged:
        parser.add_argument("--staged", metavar="FILE",
                            help="the staged dataset that `stage` printed (its JSON): use "
                                 "it, verified, instead of staging again")
    for group_name in SECTIONS:
        group = parser.add_argument_group(f"{group_name} settings")
        for spec in (s for s in flat_fields() if s.section == group_name):
            group.add_argument(f"--{spec.key.replace('_', '-')}", dest=spec.key,
                               default=argparse.SUPPRESS, help=_help(spec), **_kind(spec))


def _kind(spec: FieldSpec) -> dict[str, Any]:
    if spec.type == "boolean":
        return {"action": argparse.BooleanOptionalAction}
    if spec.type == "array":
        return {"nargs": "*", "metavar": "VALUE"}
    if spec.type == "object":
        return {"type": _json_object, "metavar": "JSON"}
    if spec.type == "integer":
        return {"type": int, "metavar": "N"}
    if spec.type == "number":
        return {"type": float, "metavar": "X"}
    if spec.nullable:
        return {"type": lambda v: v or None, "metavar": "TEXT"}
    return {"metavar": "{" + ",".join(spec.rules["enum"]) + "}" if "enum" in spec.rules
            else "TEXT"}


def _json_object(text: str) -> Any:
    """A JSON object flag (``--model-args '{"width": 32}'``); the config checks its values."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r}")
    return value


def _help(spec: FieldSpec) -> str:
    return f"{spec.description} Allowed: {spec.allowed}. Default: {spec.default!r}.".replace(
        "%", "%%")


def markdown_table() -> str:
    """The configuration reference as a Markdown table (pasted into docs/configuration.md)."""
    rows = ["| key (`--flag`) | section.field | type | default | allowed | description |",
            "|---|---|---|---|---|---|"]
    for s in flat_fields():
        default = "empty" if s.optional else f"`{json.dumps(s.default)}`"
        where = " (deployment)" if s.deployment else ""
        rows.append(f"| `{s.key}` | {s.path}{where} | {s.type} | {default} | {s.allowed} "
                    f"| {s.description} |")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Stage datasets, train, evaluate and publish Keras models.",
        allow_abbrev=False,  # --epoch is an unknown flag, not --epochs
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {
        "stage": "Prepare the dataset once into the staging directory (cached).",
        "validate": "Stage (cached), then check the data before training: skip when "
                    "production was trained on the same data and settings, fail with "
                    "every reason when a check fails.",
        "train": "Stage (cached), verify and train; write the run directory.",
        "evaluate": "Evaluate the run's model and the production model on the test "
                    "split; decide; write evaluation.json (kept while what it was made "
                    "from is unchanged).",
        "publish": "Publish the run's model as a version in the store; promote it if the "
                   "evaluation decided so.",
        "run": "stage, validate, train, evaluate, publish and promote in one process.",
    }
    for name, text in commands.items():
        cmd = sub.add_parser(name, help=text, description=text, allow_abbrev=False)
        _add_config_flags(cmd, staged=name != "stage")
        if name in ("train", "evaluate"):
            cmd.add_argument("--data-stats", metavar="FILE",
                             help="validate's data statistics (JSON), published with the "
                                  "version and shown in its report")
        if name == "train":
            cmd.add_argument("--evaluate", action="store_true",
                             help="then evaluate, as the `evaluate` command does, in this "
                                  "process (TensorFlow is loaded once)")
            cmd.add_argument("--trial-of", metavar="FILE",
                             help="this run is a trial of the sweep whose config is FILE "
                                  "(with --trial): each epoch is reported to its study, "
                                  "which may prune it (docs/sweeps.md)")
            cmd.add_argument("--trial", type=int, metavar="N",
                             help="the trial's slot in that sweep (with --trial-of)")
    # Listed here for --help; main() hands `data ...` to training.data.sources.landing whole.
    sub.add_parser("data", help="The team's data: `data demo` writes the digits as daily "
                   "partitions, `data land` lands one partition (data --help).")
    models = sub.add_parser("models", help="List, show, promote or roll back model versions; "
                            "repair the MLflow mirror (sync-mlflow).",
                            description="Read and move the model registry in a store. "
                            "sync-mlflow registers every version in the MLflow tracking "
                            "server (TRAINING_MLFLOW_TRACKING_URI) and sets each model's "
                            "champion alias from production.json.",
                            allow_abbrev=False)
    models.add_argument("action", choices=["list", "show", "promote", "rollback",
                                           "sync-mlflow"])
    models.add_argument("--store-uri", default=_default("store_uri"),
                        help="s3://bucket/prefix, file:///path or a local path")
    models.add_argument("--name", help="model name (all models for list)")
    models.add_argument("--version", help="version id (show, promote, rollback)")
    models.add_argument("--reason", default="", help="why (promote, rollback)")
    models.add_argument("--no-verify", dest="verify", action="store_false",
                        help="show: print the manifest without reading the version's files "
                             "back (by default each is checked against the manifest's size "
                             "and SHA-256, as promotion does)")
    clean = sub.add_parser(
        "clean-staging", allow_abbrev=False,
        help="Remove the team's staged snapshots and partition shards that no run, no "
             "production model and no kept snapshot refers to (docs/datasets.md).")
    for flag, text in (("staging_dir", None), ("output_dir", "where the runs are"),
                       ("store_uri", "the registry whose production models keep data")):
        clean.add_argument("--" + flag.replace("_", "-"), default=_default(flag), help=text)
    clean.add_argument("--keep-latest", type=int, default=1, metavar="N",
                       help="also keep each dataset's N most recently staged snapshots")
    clean.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    schema = sub.add_parser("schema", help="Print the config's JSON Schema.", allow_abbrev=False)
    schema.add_argument("--flat", action="store_true", help="flat keys, as the trigger form")
    schema.add_argument("--markdown", action="store_true",
                        help="the configuration reference table of docs/configuration.md")
    return parser


def _default(key: str) -> Any:
    """A field's default, from the schema (no config is built for it)."""
    return next(spec.default for spec in flat_fields() if spec.key == key)


def load_config(args: argparse.Namespace) -> RunConfig:
    values = {s.key: getattr(args, s.key) for s in flat_fields() if hasattr(args, s.key)}
    if not args.config:
        return RunConfig.from_flat(values)
    return RunConfig.from_file(args.config, overrides=values)


def execute(args: argparse.Namespace) -> int:
    if args.command == "schema":
        print(markdown_table() if args.markdown else json.dumps(json_schema(flat=args.flat),
                                                                indent=2))
        return 0
    if args.command == "models":
        from training.registry.commands import models

        return models(args)
    if args.command == "clean-staging":
        return _clean_staging(args)
    cfg = load_config(args)
    if args.command == "train" and (args.trial is None) != (args.trial_of is None):
        raise ConfigError(f"--trial-of and --trial go together, got --trial-of "
                          f"{args.trial_of!r} and --trial {args.trial!r}")
    tracking_uri_from_env()  # a malformed tracking URI: exit 2 before anything is staged
    # One Keras backend per process, set before Keras is imported: the run's for
    # `train` (a JAX process imports no TensorFlow); TensorFlow for the steps that
    # stage with tensorflow-datasets and export SavedModels (training.backend).
    backend.use(cfg.runtime.backend if args.command == "train" else "tensorflow")
    if args.command in ("publish", "run") and cfg.promotion.require_approval:
        raise ConfigError(
            "promotion.require_approval is true, but the CLI has nobody to ask: run "
            "the keras_retrain DAG to wait for a person's approval, or leave it false "
            "and promote later with `python -m training models promote`")
    from training.steps import stage  # heavy (tfds): after the config is valid

    if args.command == "train" and cfg.runtime.backend == "jax":
        log.info("train run %s: configuration valid; Keras on JAX", cfg.run_id)
        staged = stage.stage_elsewhere(cfg, getattr(args, "staged", None))
    else:
        log.info("%s run %s: configuration valid; loading TensorFlow and "
                 "tensorflow-datasets", args.command, cfg.run_id)
        # Resolves the dataset name before anything is written.
        staged = stage.stage(cfg, getattr(args, "staged", None))
    print(json.dumps({"staged": staged.to_dict()}))
    if args.command == "stage":
        return 0
    if cluster.current():
        # A worker of a multi-worker run: its launcher (or the Kubernetes Job's stable
        # name) holds the run; fit.train claims it again in the chief.
        return _run_steps(args, cfg, staged)
    with claim_run(cfg.run_dir(), cfg.run_id):  # one process per run directory
        return _run_steps(args, cfg, staged)


def _run_steps(args: argparse.Namespace, cfg: RunConfig, staged: Any) -> int:
    """The steps after ``stage`` that the command asks for, in order
    (``training.steps``); each prints its result as one JSON line."""
    from training.registry.versions import open_registry
    from training.steps import evaluate, promote, publish, train, validate
    from training.sweep.record import SWEEP_JSON
    from training.tracking import tracked_registry, tracker_from_env

    data_stats = extras.data_stats(getattr(args, "data_stats", None))
    # A sweep's picked trial is evaluated, published... on its sweep's run (pipeline_run);
    # in a multi-worker run, the chief alone tracks.
    tracker, pipeline_run = tracker_from_env(), cfg.run_id
    if args.command in ("train", "run") and cluster.is_chief(cluster.current()):
        tracker.start(cfg, parent_run_id=extras.trial_of(args, cfg, staged))
    if args.command in ("validate", "run"):
        checked = validate.validate_data(cfg, staged, open_registry(cfg.storage.store_uri))
        print(json.dumps({"validation": {k: v for k, v in checked.items()
                                         if k != "data_stats"}}))
        if checked["skip"] or args.command == "validate":
            return 0
        data_stats = checked["data_stats"]
    if args.command in ("train", "run") and extras.others_track(args, cfg):
        tracker.flush()  # its run exists before they start, or each would make one
    if args.command == "run" and cfg.sweep.enabled:
        from training.launch.trials import run_sweep

        cfg = run_sweep(cfg, staged)  # the picked trial's: evaluated, published, promoted
        tracker.log_files(cfg.model_name, pipeline_run,
                          {"": layout.model_dir(cfg.run_dir()) / SWEEP_JSON})
        print(json.dumps({"sweep": {"picked": cfg.run_id, "run_dir": str(cfg.run_dir())}}))
    elif args.command in ("train", "run"):
        print(json.dumps({"trained": train.train(
            cfg, staged, extra_callbacks=extras.trial_callbacks(args, cfg, staged),
            tracking_callbacks=lambda: extras.tracking_callbacks(tracker, cfg))}))
    if args.command == "train" and not (args.evaluate and cluster.is_chief(cluster.current())):
        return 0  # in a multi-worker run, only the chief evaluates
    registry = tracked_registry(cfg.storage.store_uri)
    if args.command in ("train", "evaluate", "run"):
        evaluation = evaluate.evaluated(
            cfg, staged, registry, data_stats=data_stats,
            evaluate_now=lambda: evaluate.evaluate(cfg, staged, registry,
                                                   data_stats=data_stats))
        print(json.dumps({"evaluation": str(layout.model_dir(cfg.run_dir()) / layout.EVALUATION),
                          "test_accuracy": evaluation["challenger"]["accuracy"],
                          "decision": evaluation["decision"]}))
        tracker.log_evaluation(cfg.model_name, pipeline_run, evaluation)
        report = layout.model_dir(cfg.run_dir()) / layout.REPORT_DIR
        tracker.log_files(cfg.model_name, pipeline_run, {layout.REPORT_DIR: report})
    if args.command in ("publish", "run"):
        evaluate.read_evaluation(cfg)  # evaluated first: says so if not
        started = publish.started_at(cfg)
        published = publish.publish(cfg, registry, created=started)
        print(json.dumps({"published": published}))
        tracker.set_tags(cfg.model_name, pipeline_run, {"published.version": cfg.run_id})
        tracker.registered(cfg.model_name, cfg.run_id, registry.store.uri, run_id=pipeline_run)
        print(json.dumps({"promotion": promote.promote(cfg, registry, at=started)}))
        tracker.end(cfg.model_name, pipeline_run, "complete")
    return 0


def _clean_staging(args: argparse.Namespace) -> int:
    from training.data.snapshot.staging_cleanup import clean_staging

    print(json.dumps(clean_staging(args.staging_dir, args.output_dir, args.store_uri,
                                   keep_latest=args.keep_latest, dry_run=args.dry_run)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["data"]:
        from training.data.sources import landing

        return landing.main(argv[1:], prog="python -m training data")
    args = build_parser().parse_args(argv)
    return run_command(lambda: execute(args))
