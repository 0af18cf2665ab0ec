"""A step's child process (training.launch.command.TrainingCommand): its command line,
its inputs in files, its credentials in the environment only, its exit code decoding,
and stop() ending it mid-run. A stand-in interpreter (a shell script) plays ``python``
so the behaviour under test is the launcher's own, not TensorFlow's start."""

from __future__ import annotations

import json
import threading
import time

import pytest

from training.errors import ConfigError, LaunchError
from training.launch.command import TrainingCommand


def _interpreter(tmp_path, body: str):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def _command(tmp_path, body: str, **kwargs) -> TrainingCommand:
    return TrainingCommand("train", tmp_path / "run-config.json", output_dir=tmp_path / "runs",
                           run_id="night-1", python=_interpreter(tmp_path, body), **kwargs)


def test_inputs_go_in_files_and_credentials_only_in_the_environment(tmp_path):
    body = ('echo "{\\"argv\\": \\"$*\\"}"\n'
            'echo "{\\"key\\": \\"$AWS_SECRET_ACCESS_KEY\\"}"\n')
    command = _command(tmp_path, body, staged={"name": "digits"}, flags=("--evaluate",),
                       env={"AWS_SECRET_ACCESS_KEY": "s3cret"})
    lines: list[str] = []
    logged = command.argv()  # what the operator logs; run() reuses it
    staged = tmp_path / "runs" / "night-1.staged.json"
    staged.write_text('{"name": "digits"} ')  # a rewrite would drop the space
    printed = command.run(lines.append)
    assert staged.read_text() == '{"name": "digits"} ' and command.argv() == logged
    assert printed["argv"] == (f"-m training train --config {tmp_path / 'run-config.json'} "
                               f"--staged {staged} --evaluate")
    assert json.loads(staged.read_text()) == {"name": "digits"}
    assert printed["key"] == "s3cret"
    assert "s3cret" not in " ".join(command.argv())
    assert not (tmp_path / "runs" / "night-1.data-stats.json").exists()


def test_exit_2_is_a_configuration_error_and_any_other_failure_a_launch_error(tmp_path):
    refused = _command(tmp_path, 'echo "error: fit.epochs must be between 1 and 1000"\n'
                                 "exit 2\n")
    with pytest.raises(ConfigError, match=r"training refused its configuration \(exit 2, "
                                          r"not retried\): error: fit.epochs must be"):
        refused.run(lambda line: None)
    crashed = _command(tmp_path, 'echo "error: the store did not answer"\nexit 1\n')
    with pytest.raises(LaunchError, match="training exited with code 1: error: the store"):
        crashed.run(lambda line: None)


def test_stop_ends_a_running_command(tmp_path):
    command = _command(tmp_path, "echo started\nexec sleep 60\n")
    lines: list[str] = []
    outcome: dict = {}

    def run() -> None:
        try:
            command.run(lines.append)
        except LaunchError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30  # a hang guard, not a measurement
    while "started" not in lines:
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.01)
    assert command.running()
    command.stop()
    thread.join(10)
    assert not thread.is_alive() and not command.running()
    assert "exited with code -15" in str(outcome["error"])
