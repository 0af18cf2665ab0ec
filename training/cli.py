"""``python -m training <command>``: one command per pipeline stage.

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
import os
import sys
from collections.abc import Sequence
from typing import Any

from training.config import FieldSpec, RunConfig, flat_fields, json_schema
from training.errors import ConfigError, TrainingError

log = logging.getLogger("training")


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="JSON config file (nested by section)")
    for group_name in ("dataset", "model", "fit", "runtime", "storage"):
        group = parser.add_argument_group(f"{group_name} settings")
        for spec in (s for s in flat_fields() if s.section == group_name):
            group.add_argument(f"--{spec.key.replace('_', '-')}", dest=spec.key,
                               default=argparse.SUPPRESS, help=_help(spec), **_kind(spec))


def _kind(spec: FieldSpec) -> dict[str, Any]:
    if spec.type == "boolean":
        return {"action": argparse.BooleanOptionalAction}
    if spec.type == "array":
        return {"nargs": "*", "metavar": "VALUE"}
    if spec.type == "integer":
        return {"type": int, "metavar": "N"}
    if spec.type == "number":
        return {"type": float, "metavar": "X"}
    if spec.nullable:
        return {"type": lambda v: v or None, "metavar": "TEXT"}
    return {"metavar": "{" + ",".join(spec.rules["enum"]) + "}" if "enum" in spec.rules
            else "TEXT"}


def _help(spec: FieldSpec) -> str:
    allowed = ""
    if "enum" in spec.rules:
        allowed = f" One of: {', '.join(spec.rules['enum'])}."
    elif "minimum" in spec.rules or "maximum" in spec.rules:
        allowed = f" Range: {spec.rules.get('minimum', '')}..{spec.rules.get('maximum', '')}."
    return f"{spec.description}{allowed} Default: {spec.default!r}.".replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Stage datasets, train, evaluate and publish Keras models.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {
        "stage": "Prepare the dataset once into the staging directory (cached).",
        "train": "Stage (cached), verify and train; write the run directory.",
        "evaluate": "Evaluate the run's model on the test split; write evaluation.json.",
        "run": "stage, train and evaluate in one process.",
    }
    for name, text in commands.items():
        cmd = sub.add_parser(name, help=text, description=text)
        _add_config_flags(cmd)
    schema = sub.add_parser("schema", help="Print the config's JSON Schema.")
    schema.add_argument("--flat", action="store_true", help="flat keys, as the trigger form")
    return parser


def load_config(args: argparse.Namespace) -> RunConfig:
    values = {s.key: getattr(args, s.key) for s in flat_fields() if hasattr(args, s.key)}
    base = RunConfig.from_file(args.config) if args.config else RunConfig()
    return base.with_overrides(values)


def _stage(cfg: RunConfig):
    from training import datasets

    staged = datasets.stage(cfg.dataset)
    print(json.dumps({"staged": staged.to_dict()}))
    return staged


def _evaluate(cfg: RunConfig, staged) -> dict[str, Any]:
    import keras

    from training import datasets
    from training.evaluate import evaluate_model, write_evaluation

    model = keras.saving.load_model(cfg.run_dir() / "model.keras", safe_mode=True)
    builder = datasets.load_builder(staged)
    test = datasets.make_dataset(builder, "test", global_batch_size=256, shuffle=False,
                                 seed=cfg.fit.seed)
    evaluation = {"dataset": staged.key, **evaluate_model(model, test)}
    path = write_evaluation(cfg.run_dir(), evaluation)
    print(json.dumps({"evaluation": os.fspath(path), "test_loss": evaluation["loss"],
                      "test_accuracy": evaluation["accuracy"]}))
    return evaluation


def execute(args: argparse.Namespace) -> int:
    if args.command == "schema":
        print(json.dumps(json_schema(flat=args.flat), indent=2))
        return 0
    cfg = load_config(args)
    from training import datasets  # heavy (tfds): after the config is known to be valid

    datasets.get_builder(cfg.dataset.name, cfg.dataset.version, cfg.dataset.staging_dir)
    staged = _stage(cfg)
    if args.command == "stage":
        return 0
    if args.command in ("train", "run"):
        from training.fit import train

        result = train(cfg, staged)
        print(json.dumps({"trained": result.to_dict()}))
    if args.command in ("evaluate", "run"):
        _evaluate(cfg, staged)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return execute(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
