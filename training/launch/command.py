"""One step of a run as a child process: ``python -m training COMMAND`` on its frozen config.

What an Airflow task runs where TensorFlow is needed (``stage`` when the dataset is
not cached yet, ``train --evaluate`` for ``launcher=local``, ``evaluate`` when the
evaluation no longer stands), so that the task process never loads it. The run's frozen
config goes with ``--config`` (``training.config.frozen``); what the steps before
returned (the staged dataset, the data statistics) goes in files beside the run
directory (``--staged``, ``--data-stats``); the store's credentials go in the
environment only, never on the command line.

``TrainingCommand`` has the launchers' interface: ``run`` starts it (``child.Child``: its
own process group, its lines streamed without TensorFlow's CUDA noise) and returns
what it printed as JSON; ``stop`` (a task killed or timed out) sends SIGTERM to its
group. ``forward_signals`` (``python -m training run --backend jax``, whose JAX training
is such a child) passes SIGTERM and SIGINT to this process on to the child while it
runs (``Child``). Its exit code decides: 0 returns, 2 raises ``ConfigError`` (a
configuration no retry can fix), anything else ``LaunchError`` whose ``exit_status`` is
the child's as a shell reports it (143 after a SIGTERM), the status a command line
calling it ends with (``training.entry.run_command``); each message carries the
message of the child's ``error:`` line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from training import backend
from training.errors import CONFIG_ERROR_EXIT, ConfigError, LaunchError
from training.launch import processes
from training.launch.child import Child


class TrainingCommand:
    """``python -m training COMMAND --config CONFIG`` for run ``run_id``."""

    def __init__(self, command: str, config: str | os.PathLike[str], *,
                 output_dir: str | os.PathLike[str], run_id: str,
                 staged: Mapping[str, Any] | None = None,
                 data_stats: Mapping[str, Any] | None = None, flags: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 python: str = sys.executable, forward_signals: bool = False) -> None:
        self.command, self.config = command, os.fspath(config)
        self.output_dir, self.run_id = Path(output_dir), run_id
        self.inputs = {"--staged": staged, "--data-stats": data_stats}
        self.flags, self.python = list(flags), python
        self.env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                    **backend.env(self.backend()), **(env or {})}
        self.cwd = cwd or os.getcwd()
        self.forward_signals = forward_signals
        self.child: Child | None = None
        self._argv: list[str] | None = None

    def backend(self) -> str:
        """The Keras backend of the child: the run's ``runtime.backend`` for ``train``,
        TensorFlow for the other steps (staging, the SavedModel); the config's own checks
        are the child's (``tensorflow`` until it reads as one)."""
        if self.command != "train":
            return "tensorflow"
        try:
            found = json.loads(Path(self.config).read_text())["runtime"]["backend"]
        except (OSError, ValueError, KeyError, TypeError):
            return "tensorflow"
        return found if found in backend.BACKENDS else "tensorflow"

    def argv(self) -> list[str]:
        """The command line; the first call writes the steps' inputs beside the run
        directory (logged, then run: written once)."""
        if self._argv is None:
            self._argv = self._written_argv()
        return list(self._argv)

    def _written_argv(self) -> list[str]:
        args = [self.python, "-m", "training", self.command, "--config", self.config]
        for flag, value in self.inputs.items():
            if value is not None:
                self.output_dir.mkdir(parents=True, exist_ok=True)
                path = self.output_dir / f"{self.run_id}.{flag[2:]}.json"
                path.write_text(json.dumps(value))
                args += [flag, os.fspath(path)]
        return [*args, *self.flags]

    def run(self, on_line: Callable[[str], None]) -> dict[str, Any]:
        """Run it to its end, its lines to ``on_line``; what it printed as JSON."""
        self.child = Child(self.argv(), self.env, self.cwd,
                           forward_signals=self.forward_signals)
        ended = self.child.run(on_line)
        what = "training" if self.command == "train" else f"`{self.command}`"
        if ended.code == CONFIG_ERROR_EXIT:
            raise ConfigError(f"{what} refused its configuration (exit {ended.code}, not "
                              f"retried): {ended.error or 'no error line'}")
        if ended.code != 0:
            after = "".join(f" after the {signal.Signals(s).name} passed on to it"
                            for s in ended.forwarded[:1])
            raise LaunchError(f"{what} exited with code {ended.code}{after}: "
                              f"{ended.error or 'no error line; see the log above'}",
                              processes.shell_status(ended.code))
        return ended.results

    def running(self) -> bool:
        return self.child is not None and self.child.running()

    def stop(self) -> None:
        """SIGTERM to its process group, if it runs."""
        if self.child is not None:
            self.child.stop()
