"""Local multi-worker training: N worker processes on this machine, one ``TF_CONFIG`` each.

``run(cfg)`` starts ``cfg.runtime.workers`` processes of the worker entry below
(``python -m training.launch.local worker --config FILE --staged FILE``), each with a
``TF_CONFIG`` naming every worker on a free 127.0.0.1 port and its own task index, so
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
  kernel if the launcher dies (``PR_SET_PDEATHSIG`` on Linux).
* Staging: the dataset is staged once before any worker starts (``staged`` given, or a
  ``python -m training stage`` subprocess), so workers only read the cache.

Each worker applies the Keras 3 multi-worker compatibility layer (``training.train.compat``)
before training and, at the end of training, logs ``final weights digest sha256:...``;
the launcher collects the digests and fails the run when they differ (the gradients
were not all-reduced). Nothing here imports TensorFlow: only the worker processes do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from training.config import RunConfig
from training.errors import ConfigError, LaunchError
from training.locks import claimed_env

log = logging.getLogger(__name__)

DIGEST_MARK = "final weights digest sha256:"
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# --- cluster ---------------------------------------------------------------------------

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


def tf_config(ports: Sequence[int], index: int, host: str = "127.0.0.1") -> str:
    """``TF_CONFIG`` for worker ``index`` of a cluster of workers on ``host:ports``."""
    if not 0 <= index < len(ports):
        raise ConfigError(f"worker index must be between 0 and {len(ports) - 1}, got {index}")
    return json.dumps({
        "cluster": {"worker": [f"{host}:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })


# --- launcher --------------------------------------------------------------------------

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


class _Stop(Exception):
    pass


def _pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _signal_code(code: int) -> int:
    """A process exit status as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _stage_subprocess(config_path: Path, python: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [python, "-m", "training", "stage", "--config", os.fspath(config_path)],
        env=env, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise LaunchError(
            f"staging the dataset before launching the workers failed with status "
            f"{proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}"
        )
    for line in proc.stdout.splitlines():
        if line.startswith('{"staged"'):
            return json.loads(line)["staged"]
    raise LaunchError(f"python -m training stage printed no staged dataset: {proc.stdout!r}")


def _check(cfg: RunConfig, workers: int) -> None:
    if not 1 <= workers <= 64:
        raise ConfigError(f"runtime.workers must be between 1 and 64, got {workers}")
    if workers > 1 and cfg.runtime.strategy not in ("auto", "multi_worker"):
        raise ConfigError(
            f"runtime.strategy must be 'auto' or 'multi_worker' when runtime.workers is "
            f"more than 1, got {cfg.runtime.strategy!r}"
        )


def run(
    cfg: RunConfig,
    *,
    workers: int | None = None,
    staged: Any = None,
    grace_s: float = 10.0,
    timeout_s: float | None = None,
    out: TextIO | None = None,
    on_start: Callable[[list[subprocess.Popen]], None] | None = None,
    on_line: Callable[[int, str], None] | None = None,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    report_dir: str | os.PathLike | None = None,
    scratch_dir: str | os.PathLike | None = None,
) -> LaunchResult:
    """Train ``cfg`` with ``workers`` (default ``cfg.runtime.workers``) local processes.

    staged: a ``StagedDataset`` (or its dict); None stages in a subprocess first.
    grace_s: seconds between SIGTERM and SIGKILL when workers are stopped.
    timeout_s: stop every worker after this long (None: no limit).
    out: where the prefixed worker logs go (default ``sys.stdout``).
    on_start(processes) / on_line(index, line): hooks for callers and tests.
    env: environment of the workers (default ``os.environ``); ``TF_CONFIG`` is replaced.
    report_dir: each worker writes ``worker-<index>.json`` there (final weights digest,
    per-epoch logs) at the end of training.
    scratch_dir: where the launch directory (config, staged dataset, each worker's
    ``TMPDIR``) is made; default the system temp dir. It is removed at the end, so a
    killed non-chief's temporary run directory goes with it.
    """
    workers = cfg.runtime.workers if workers is None else workers
    _check(cfg, workers)
    out = out or sys.stdout
    base_env = dict(os.environ if env is None else env)
    base_env.pop("TF_CONFIG", None)
    base_env.update(claimed_env())  # the workers work under this process's run claim
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    base_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if cfg.runtime.accelerator == "cpu":
        base_env.setdefault("CUDA_VISIBLE_DEVICES", "")  # N workers must not share GPUs
    run_dir = os.fspath(cfg.run_dir())
    launch_dir = Path(tempfile.mkdtemp(prefix="launch-", dir=scratch_dir))
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    lock = threading.Lock()
    digests: dict[int, str] = {}
    trained: dict[str, Any] = {}
    stop_signal: list[int] = []

    def handle(signum: int, _frame: Any) -> None:
        stop_signal.append(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _STOP_SIGNALS:
            previous[sig] = signal.signal(sig, handle)
    try:
        config_path = cfg.write(launch_dir)
        if staged is None:
            staged_dict = _stage_subprocess(config_path, python, base_env)
        else:
            staged_dict = staged if isinstance(staged, dict) else staged.to_dict()
        staged_path = launch_dir / "staged.json"
        staged_path.write_text(json.dumps(staged_dict))
        ports = free_ports(workers)
        command = [python, "-m", "training.launch.local", "worker", "--config",
                   os.fspath(config_path), "--staged", os.fspath(staged_path)]
        if report_dir is not None:
            command += ["--report-dir", os.fspath(report_dir)]

        def pump(index: int, stream: TextIO) -> None:
            for raw in stream:
                line = raw.rstrip("\n")
                if DIGEST_MARK in line:
                    digests[index] = line.split(DIGEST_MARK, 1)[1].split()[0]
                if index == 0 and line.startswith('{"trained"'):
                    with contextlib.suppress(ValueError):
                        trained.update(json.loads(line)["trained"])
                with lock:
                    out.write(f"[worker {index}] {line}\n")
                    out.flush()
                if on_line is not None:
                    on_line(index, line)

        log.info("launching %d workers on 127.0.0.1 ports %s; chief run dir %s",
                 workers, ", ".join(map(str, ports)), run_dir)
        for index in range(workers):
            if stop_signal:
                break
            tmp = launch_dir / f"tmp-{index}"  # fit.train's non-chief run dir lands here
            tmp.mkdir()
            proc = subprocess.Popen(
                command,
                env={**base_env, "TF_CONFIG": tf_config(ports, index), "TMPDIR": os.fspath(tmp)},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", bufsize=1,
                start_new_session=True,  # its own process group: stopped as one
                preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,
            )
            procs.append(proc)
            reader = threading.Thread(target=pump, args=(index, proc.stdout),
                                      name=f"worker-{index}-log", daemon=True)
            reader.start()
            readers.append(reader)
        if on_start is not None:
            on_start(list(procs))
        returncode, failed, reason = _supervise(procs, workers, stop_signal, timeout_s)
        if returncode != 0:
            _stop(procs, grace_s)
    finally:
        if procs:
            _stop(procs, grace_s)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for reader in readers:
            reader.join(timeout=5)
        shutil.rmtree(launch_dir, ignore_errors=True)
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


def _supervise(procs: list[subprocess.Popen], workers: int, stop_signal: list[int],
               timeout_s: float | None) -> tuple[int, int | None, str]:
    """Wait for every worker; (returncode, failed worker, reason) at the first failure."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if stop_signal:
            sig = signal.Signals(stop_signal[0])
            return 128 + sig.value, None, f"the launcher received {sig.name}"
        if len(procs) < workers:
            return 1, None, "not every worker started"
        codes = [p.poll() for p in procs]
        for index, code in enumerate(codes):
            if code not in (None, 0):
                return (_signal_code(code) or 1, index,
                        f"worker {index} {_describe(code)}; stopping the others")
        if all(code == 0 for code in codes):
            return 0, None, ""
        if deadline is not None and time.monotonic() > deadline:
            return 124, None, f"the workers did not finish within {timeout_s:g} s"
        time.sleep(0.1)


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every running worker's process group, SIGKILL what is left after grace_s."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in running:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- worker entry ----------------------------------------------------------------------

def weights_digest(model: Any) -> str:
    """SHA-256 over a Keras model's weights (dtype, shape and bytes of each, in order)."""
    import hashlib

    import numpy as np

    digest = hashlib.sha256()
    for weight in model.get_weights():
        array = np.ascontiguousarray(weight)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _task_index() -> int:
    data = json.loads(os.environ.get("TF_CONFIG") or "{}")
    return int(data.get("task", {}).get("index", 0))


def _weights_report(report_dir: str | None) -> Any:
    """A callback that logs the final weights digest (and writes a report file)."""
    import keras

    class WeightsReport(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epochs: list[dict[str, float]] = []

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.epochs.append({"epoch": epoch + 1,
                                **{k: float(v) for k, v in (logs or {}).items()}})

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            digest = weights_digest(self.model)
            print(f"{DIGEST_MARK}{digest}", flush=True)
            if report_dir:
                index = _task_index()
                path = Path(report_dir) / f"worker-{index}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"index": index, "digest": digest,
                                            "epochs": self.epochs}, indent=2) + "\n")

    return WeightsReport()


def worker_main(args: argparse.Namespace) -> int:
    """One worker: apply the Keras compat layer, then ``fit.train`` (TF_CONFIG is set)."""
    from training.data.staging import StagedDataset
    from training.train import compat, fit

    if not os.environ.get("TF_CONFIG"):
        raise ConfigError("the worker entry needs TF_CONFIG; start it with run()")
    cfg = RunConfig.from_file(args.config)
    staged = StagedDataset.from_dict(json.loads(Path(args.staged).read_text()))
    # fit.train builds the MultiWorkerMirroredStrategy; the patches only act once the
    # strategy is in multi-worker mode, so installing them first is safe (and
    # compat.apply(strategy) inside fit.train, when present, is then a no-op).
    compat.enable()
    result = fit.train(cfg, staged, extra_callbacks=[_weights_report(args.report_dir)])
    print(json.dumps({"trained": result.to_dict()}), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.launch.local",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="one worker process (started by run())")
    worker.add_argument("--config", required=True, help="the run's config.json")
    worker.add_argument("--staged", required=True, help="the staged dataset, as JSON")
    worker.add_argument("--report-dir", help="write worker-<index>.json here at the end")
    launch = sub.add_parser("launch", help="start N local workers for a config file")
    launch.add_argument("--config", required=True, help="the run's config.json")
    launch.add_argument("--workers", type=int, help="default: runtime.workers")
    launch.add_argument("--grace", type=float, default=10.0, help="SIGTERM -> SIGKILL, s")
    launch.add_argument("--report-dir", help="each worker writes worker-<index>.json here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from training.cli import run_command

    args = build_parser().parse_args(argv)

    def command() -> int:
        if args.command == "worker":
            return worker_main(args)
        cfg = RunConfig.from_file(args.config)
        result = run(cfg, workers=args.workers, grace_s=args.grace,
                     report_dir=args.report_dir)
        print(json.dumps({"launch": result.to_dict()}))
        return result.returncode

    return run_command(command)


if __name__ == "__main__":
    sys.exit(main())
