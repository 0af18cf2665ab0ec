"""A step's child process (training.launch.command.TrainingCommand): its command line,
its inputs in files, its credentials in the environment only, its exit code decoding,
stop() ending it mid-run, and the signals a parent passes on to it (``run --backend
jax``). A stand-in interpreter (a shell script) plays ``python`` so the behaviour under
test is the launcher's own, not TensorFlow's start; the signals are real, sent to a
real parent process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
                                          r"not retried\): fit.epochs must be") as refusal:
        refused.run(lambda line: None)
    assert "error:" not in str(refusal.value)  # the CLI adds the one prefix it prints
    crashed = _command(tmp_path, 'echo "error: the store did not answer"\nexit 1\n')
    with pytest.raises(LaunchError, match="training exited with code 1: the store") as failed:
        crashed.run(lambda line: None)
    assert failed.value.exit_status == 1


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


def test_a_forwarding_command_puts_the_signal_handlers_back(tmp_path):
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT,
                                                     signal.SIGHUP)}
    command = _command(tmp_path, 'echo "{\\"done\\": 1}"\n', forward_signals=True)
    assert command.run(lambda line: None) == {"done": 1}
    assert {sig: signal.getsignal(sig) for sig in before} == before


# The parent: what `python -m training run` does around its training child, through the
# CLI's own exit path (one `error:` line, the exception's exit status).
PARENT = """\
import sys
from training.entry import run_command
from training.launch.command import TrainingCommand

def command():
    TrainingCommand("train", "run-config.json", output_dir="runs", run_id="night-1",
                    python=sys.argv[1], forward_signals=True).run(print)
    return 0

sys.exit(run_command(command))
"""

# The child traps the signals training reacts to and says which one came.
CHILD = """\
trap 'echo "got TERM"; exit 143' TERM
trap 'echo "got INT"; echo "error: interrupted"; exit 130' INT
echo started
while :; do sleep 0.1; done
"""


@pytest.mark.slow
@pytest.mark.parametrize(("sent", "seen", "status"), [
    (signal.SIGTERM, "got TERM", 143),
    (signal.SIGINT, "got INT", 130),
    (signal.SIGHUP, "got TERM", 143),  # training handles no SIGHUP: passed on as SIGTERM
])
def test_a_signal_to_the_parent_reaches_the_child_and_the_parent_exits_with_its_status(
    tmp_path, sent, seen, status
):
    child = _interpreter(tmp_path, CHILD)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, child], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"},
                              start_new_session=True)
    guard = threading.Timer(120, parent.kill)  # a hang fails on the status, not a timing
    guard.start()
    try:
        lines = []
        for line in parent.stdout:
            lines.append(line.rstrip("\n"))
            if lines[-1] == "started":
                parent.send_signal(sent)  # the parent alone: the child has its own group
        code = parent.wait()
    finally:
        guard.cancel()
    assert seen in lines, lines
    assert code == status, lines
    name = signal.Signals(sent).name
    assert lines[-1].startswith(f"error: training exited with code {status} after the "
                                f"{name} passed on to it"), lines
    assert lines[-1].count("error:") == 1, lines


def test_a_command_in_another_thread_leaves_the_signals_to_their_owner(tmp_path):
    # Airflow runs on_kill from its own SIGTERM handler; a command run outside the main
    # thread installs none (Python would refuse) and still runs.
    command = _command(tmp_path, 'echo "{\\"done\\": 1}"\n', forward_signals=True)
    handler = signal.getsignal(signal.SIGTERM)
    found: dict = {}
    thread = threading.Thread(target=lambda: found.update(command.run(lambda line: None)))
    thread.start()
    thread.join(30)
    assert found == {"done": 1} and signal.getsignal(signal.SIGTERM) is handler
