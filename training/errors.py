"""The project's exceptions: one base class, one subclass per area.

Every message names what was received and what is allowed, in the style of the
Keras callbacks: ``epochs must be between 1 and 1000, got 0``. One exception is not
an error: ``Preempted``, the exit of a training stopped on a signal after its backup.
The exit statuses a command line ends with, by kind of error, are here beside them
(``training.entry.run_command`` applies them).
"""

from typing import Any

ERROR_EXIT = 1  # any other error: a retry may succeed
CONFIG_ERROR_EXIT = 2  # a ConfigError (a bad configuration): no retry can fix it


def shown(value: Any, limit: int = 200) -> str:
    """``repr(value)`` (the text, for an exception) cut to ``limit`` characters: error
    messages echo what they received, but never an input of any length."""
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class TrainingError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(TrainingError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class DatasetError(TrainingError):
    """A dataset cannot be found, staged, verified or read."""


class ValidationError(DatasetError):
    """The staged data failed validation; the message lists every reason."""


class StorageError(TrainingError):
    """The object store refused or failed an operation."""


class ConflictError(StorageError):
    """A conditional write lost: the object exists or changed since it was read."""


class IntegrityError(StorageError):
    """Stored bytes do not match their recorded checksum."""


class RegistryError(TrainingError):
    """A model registry operation was refused (bad name, unknown version, ...)."""


class BusyError(TrainingError):
    """A run or staging directory is claimed by another process that is still working."""


class LaunchError(TrainingError, RuntimeError):
    """Training ended without a model: a worker or the training process exited non-zero,
    a Kubernetes Job failed, or a launcher could not start it. ``exit_status``, when
    known, is the status the command line ends with (the child's, as a shell reports it:
    143 after a SIGTERM passed on to it)."""

    def __init__(self, message: str, exit_status: int | None = None) -> None:
        super().__init__(message)
        if exit_status is not None:
            self.exit_status = exit_status


class SweepRefused(LaunchError):
    """A sweep's pick has nothing it may go on with: no trial completed, or more failed
    than ``sweep.max_failed`` allows. Final: the trials have ended, and picking again
    finds the same."""


class WorkersFailed(LaunchError):
    """A worker of a local multi-worker run failed; ``exit_status`` is the status the
    launcher ends with (the failed worker's, as ``training.launch.local`` reports it)."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message, exit_status)


class ReportError(TrainingError):
    """A report cannot be built from the given directory."""


class Preempted(SystemExit):
    """Training stopped on a signal after writing a backup.

    A ``SystemExit`` so that ``python -m training train`` exits ``128 + signum`` (143
    for SIGTERM) without every caller having to know about it; in-process callers can
    catch it by name.
    """

    def __init__(self, signum: int, *, epoch: int, batch: int, backup_dir: str) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.epoch = epoch  # 1-based: the epoch a re-run starts with
        self.batch = batch  # batches of it done before the stop (0: stopped between epochs)
        self.backup_dir = backup_dir
