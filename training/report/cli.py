"""``python -m training.report MODEL_DIR``: rebuild the report of a model directory."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from training.layout import CONFIG, EVALUATION, HISTORY, REPORT_DIR, REPORT_INDEX, RUN


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.report", allow_abbrev=False,
        description=f"Build MODEL_DIR/{REPORT_DIR}/{REPORT_INDEX} and its plots from the "
                    f"run's {HISTORY}, {EVALUATION}, {CONFIG} and {RUN}, and print its path.")
    parser.add_argument("model_dir", metavar="MODEL_DIR",
                        help="the run's model/ directory (<run_dir>/model)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0 with the page's path on stdout; a bad command line exits 2 with
    argparse's usage and ``error:`` line, a failed build 1 with one ``error:`` line."""
    from training.entry import run_command
    from training.report.build import build_report

    args = build_parser().parse_args(argv)

    def command() -> int:
        print(build_report(args.model_dir))
        return 0

    return run_command(command)
