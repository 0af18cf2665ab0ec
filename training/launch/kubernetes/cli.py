"""``python -m training.launch.kubernetes``: ``exec`` and ``tf-config`` inside pods,
``render`` by hand.

``exec -- COMMAND ...`` is every rendered pod's entry (``pod.WRAPPER``): it sets this
pod's ``TF_CONFIG`` and replaces itself with the command. ``render`` prints the run's
objects as YAML (``kubectl apply -f -``) or a JSON ``v1 List``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from training.config import RunConfig
from training.errors import ConfigError
from training.launch.kubernetes.manifests import render, to_yaml
from training.launch.kubernetes.options import KubernetesOptions
from training.launch.kubernetes.pod import exec_command, tf_config_from_env

# Options that have a flag of their own (they override --options).
_FLAGS = ("namespace", "image", "service_account", "credentials_secret")


def _render_command(args: argparse.Namespace) -> str:
    cfg = RunConfig.from_file(args.config) if args.config else RunConfig()
    data: dict[str, Any] = {}
    if args.options:
        try:
            with open(args.options) as fh:
                data = json.load(fh)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read Kubernetes options {args.options!r}: {exc}") from None
    for key in _FLAGS:
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    objects = render(cfg, KubernetesOptions.from_dict(data))
    if args.output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2)
    return to_yaml(objects)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.launch.kubernetes",
        description="Kubernetes specs for a training run: a ConfigMap, a headless Service, "
                    "an Indexed Job.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("tf-config", help="Print this pod's TF_CONFIG (empty for one worker).")
    run = sub.add_parser("exec", help="Set TF_CONFIG for this pod, then exec the command.")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    render_cmd = sub.add_parser("render", help="Print the run's Kubernetes objects.")
    render_cmd.add_argument("--config", metavar="FILE", help="JSON run config")
    render_cmd.add_argument("--options", metavar="FILE", help="JSON KubernetesOptions")
    for key in _FLAGS:
        render_cmd.add_argument(f"--{key.replace('_', '-')}", dest=key, default=None)
    render_cmd.add_argument("--output", choices=["yaml", "json"], default="yaml")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from training.entry import run_command

    args = build_parser().parse_args(argv)

    def command() -> int:
        if args.command == "tf-config":
            print(tf_config_from_env() or "")
        elif args.command == "exec":
            exec_command(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
        else:
            print(_render_command(args), end="")
        return 0

    return run_command(command)
