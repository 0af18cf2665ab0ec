"""Local multi-worker training: the supervisor of N worker processes on this machine.

``run(cfg)`` starts ``cfg.runtime.workers`` processes of the worker entry
(``python -m training.launch.worker --config FILE --staged FILE``, see
``training.launch.worker``), each with a ``TF_CONFIG`` (``training.train.cluster``)
naming every worker on a free 127.0.0.1 port and its own task index, so
``strategy.resolve`` builds a ``MultiWorkerMirroredStrategy`` in each (strategy
``auto`` or ``multi_worker``). Worker 0 is the chief: it alone writes the run directory
(``fit.train``); the others write to temporary directories that ``fit.train`` removes
(under a per-worker ``TMPDIR`` the launcher removes too, in case a worker was killed).

* Logs: every line a worker prints (stdout and stderr) is streamed as ``[worker i] ...``.
* Fail fast: when a worker exits non-zero or is killed, the others get SIGTERM, then
  SIGKILL after ``grace_s``; ``run`` returns a non-zero code. A chief that did not
  finish never wrote ``model/model.keras`` (it is written after ``model.fit`` returns).
* Signals: SIGTERM, SIGINT or SIGHUP to the launcher stop the workers the same way
  (when ``run`` is called from the main thread); workers also get SIGTERM from the
  kernel if the launcher dies (``PR_SET_PDEATHSIG`` on Linux). Both are
  ``training.launch.processes``, which ``child.Child`` uses too.
* Staging: the dataset is staged once before any worker starts (``staged`` given, or a
  ``python -m training stage`` subprocess), so workers only read the cache.
* Agreement: each worker prints its final weights digest; the launcher fails the run
  when they differ (the gradients were not all-reduced).

Nothing here imports TensorFlow: only the worker processes do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from training import backend
from training.config import RunConfig
from training.entry import run_command
from training.errors import LaunchError
from training.launch import processes
from training.launch.worker import DIGEST_MARK, TRAINED_PREFIX
from training.locks import claimed_env
from training.train import cluster

log = logging.getLogger(__name__)

def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now (all held open while choosing)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class LaunchResult:
    """What a local multi-worker run ended with; ``run_dir`` is the chief's."""

    returncode: int
    run_dir: str
    workers: int
    exit_codes: list[int | None]
    failed_worker: int | None = None
    reason: str = ""
    digests: dict[int, str] = field(default_factory=dict)
    trained: dict[str, Any] | None = None  # the chief's TrainResult, as printed

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def stage_subprocess(config_path: Path, python: str, env: dict[str, str]) -> dict[str, Any]:
    """The staged dataset of the config at ``config_path``, staged by ``python -m
    training stage`` (TensorFlow's process: a JAX process or a launcher stages through
    this); LaunchError with its last line if it fails."""
    proc = subprocess.run(
        [python, "-m", "training", "stage", "--config", os.fspath(config_path)],
        env=env, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise LaunchError(
            f"staging the dataset in a child process failed with status "
            f"{proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}"
        )
    for line in proc.stdout.splitlines():
        if line.startswith('{"staged"'):
            return json.loads(line)["staged"]
    raise LaunchError(f"python -m training stage printed no staged dataset: {proc.stdout!r}")


def _check(cfg: RunConfig, workers: int) -> None:
    """The config's own rules (``training.config``), for this number of workers."""
    cfg.with_overrides({"workers": workers})


def run(
    cfg: RunConfig,
    *,
    workers: int | None = None,
    staged: Any = None,
    grace_s: float = 10.0,
    report_dir: str | os.PathLike | None = None,
    timeout_s: float | None = None,
    on_start: Callable[[list[subprocess.Popen]], None] | None = None,
    on_line: Callable[[int, str], None] | None = None,
    python: str = sys.executable,
) -> LaunchResult:
    """Train ``cfg`` with ``workers`` (default ``cfg.runtime.workers``) local processes.

    staged: a ``StagedDataset`` (or its dict); None stages in a subprocess first.
    grace_s: seconds between SIGTERM and SIGKILL when workers are stopped.
    report_dir: each worker writes ``worker-<index>.json`` there (final weights digest,
    per-epoch logs) at the end of training.

    The workers' environment is this process's, ``TF_CONFIG`` replaced; their prefixed
    logs go to ``sys.stdout``. The launch directory (config, staged dataset, each
    worker's ``TMPDIR``) is made in the system temp dir and removed at the end, so a
    killed non-chief's temporary run directory goes with it; one a SIGKILLed launcher
    left is removed by the next launch (``processes.scratch_dir``).

    Test seams (no production caller sets them; each drives the real supervisor):
    timeout_s stops every worker after this long and returns 124, so a hung collective
    fails a test instead of blocking the suite; on_start(processes) and
    on_line(index, line) let a test act at an exact point of a real run (kill a worker
    after the chief's first epoch); python replaces the interpreter that runs
    ``-m training.launch.worker`` with a stand-in program, so fail-fast, SIGTERM then
    SIGKILL and signal forwarding are tested on real processes in seconds.
    """
    workers = cfg.runtime.workers if workers is None else workers
    _check(cfg, workers)
    out = sys.stdout
    base_env = dict(os.environ)
    base_env.pop(cluster.ENV, None)
    base_env.update(claimed_env())  # the workers work under this process's run claim
    base_env.update(backend.env(cfg.runtime.backend))  # set before they import Keras
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    base_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if cfg.runtime.accelerator == "cpu":
        base_env.setdefault("CUDA_VISIBLE_DEVICES", "")  # N workers must not share GPUs
    run_dir = os.fspath(cfg.run_dir())
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    lock = threading.Lock()
    digests: dict[int, str] = {}
    trained: dict[str, Any] = {}
    stop_signal: list[int] = []

    with processes.scratch_dir("launch-") as launch_dir, \
            processes.on_stop_signals(stop_signal.append):
        try:
            config_path = cfg.write(launch_dir)
            if staged is None:
                staged_dict = stage_subprocess(config_path, python,
                                               {**base_env, **backend.env("tensorflow")})
            else:
                staged_dict = staged if isinstance(staged, dict) else staged.to_dict()
            staged_path = launch_dir / "staged.json"
            staged_path.write_text(json.dumps(staged_dict))
            hosts = [f"127.0.0.1:{port}" for port in free_ports(workers)]
            command = [python, "-m", "training.launch.worker", "--config",
                       os.fspath(config_path), "--staged", os.fspath(staged_path)]
            if report_dir is not None:
                command += ["--report-dir", os.fspath(report_dir)]

            def pump(index: int, stream: TextIO) -> None:
                for raw in stream:
                    line = raw.rstrip("\n")
                    if DIGEST_MARK in line:
                        digests[index] = line.split(DIGEST_MARK, 1)[1].split()[0]
                    if index == 0 and line.startswith(TRAINED_PREFIX):
                        with contextlib.suppress(ValueError):
                            trained.update(json.loads(line)["trained"])
                    with lock:
                        out.write(f"[worker {index}] {line}\n")
                        out.flush()
                    if on_line is not None:
                        on_line(index, line)

            log.info("launching %d workers on 127.0.0.1 ports %s; chief run dir %s",
                     workers, ", ".join(h.rsplit(":", 1)[1] for h in hosts), run_dir)
            for index in range(workers):
                if stop_signal:
                    break
                tmp = launch_dir / f"tmp-{index}"  # fit.train's non-chief run dir lands here
                tmp.mkdir()
                env = {**base_env, cluster.ENV: cluster.build(hosts, index),
                       "TMPDIR": os.fspath(tmp)}
                proc = processes.start(command, env)
                procs.append(proc)
                reader = threading.Thread(target=pump, args=(index, proc.stdout),
                                          name=f"worker-{index}-log", daemon=True)
                reader.start()
                readers.append(reader)
            if on_start is not None:
                on_start(list(procs))
            returncode, failed, reason = processes.supervise(procs, workers, stop_signal,
                                                             timeout_s)
            if returncode != 0:
                processes.stop(procs, grace_s)
        finally:
            if procs:
                processes.stop(procs, grace_s)
            for reader in readers:
                reader.join(timeout=5)
    if returncode == 0 and len(set(digests.values())) > 1:
        returncode, reason = 1, f"workers ended with different weights: {digests}"
    if returncode == 0:
        log.info("all %d workers finished; chief run dir %s", workers, run_dir)
    else:
        log.error("multi-worker run failed: %s", reason)
    return LaunchResult(
        returncode=returncode, run_dir=run_dir, workers=workers,
        exit_codes=[p.returncode for p in procs], failed_worker=failed, reason=reason,
        digests=dict(digests), trained=trained or None,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.launch.local",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch", help="start N local workers for a config file")
    launch.add_argument("--config", required=True, help="the run's config.json")
    launch.add_argument("--workers", type=int, help="default: runtime.workers")
    launch.add_argument("--grace", type=float, default=10.0, help="SIGTERM -> SIGKILL, s")
    launch.add_argument("--report-dir", help="each worker writes worker-<index>.json here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command() -> int:
        cfg = RunConfig.from_file(args.config)
        result = run(cfg, workers=args.workers, grace_s=args.grace,
                     report_dir=args.report_dir)
        print(json.dumps({"launch": result.to_dict()}))
        return result.returncode

    return run_command(command)


if __name__ == "__main__":
    sys.exit(main())
