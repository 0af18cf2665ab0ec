"""Where a sweep's Optuna study lives, opened so that a storage that is down fails fast.

``sweep.storage`` empty is a SQLite file under the runs directory,
``<output_dir>/.sweeps/<model name>.db`` (the '.' keeps it apart from run directories,
whose ids start with a letter or digit): enough when every trial runs on one machine.
Trials on several workers need a database they all reach: a SQLAlchemy URL such as
``postgresql+psycopg2://optuna@db:5432/optuna``. The config refuses a URL that holds a
password (``training.config.sweep.check_storage``): libpq finds it in ``PGPASSWORD`` or
``~/.pgpass``, or the caller hands it over (the deployment reads
``TRAINING_SWEEP_STORAGE_PASSWORD``) and it goes to the driver at connect time, never
into the URL, a log line, an error or a file.

A storage that cannot be reached is a ``StorageError`` within seconds (the connect
timeouts below), naming the storage, never its password.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from training.config.sweep import redact
from training.errors import ConfigError, StorageError

SWEEPS_DIR = ".sweeps"
CONNECT_TIMEOUT_S = 10  # a database server that does not answer
SQLITE_BUSY_TIMEOUT_S = 60  # a SQLite file another trial is writing


def storage_url(cfg: Any) -> str:
    """The study storage of ``cfg``'s sweep: its URL, or the default SQLite file."""
    if cfg.sweep.storage:
        return cfg.sweep.storage
    path = Path(cfg.storage.output_dir).resolve() / SWEEPS_DIR / f"{cfg.model_name}.db"
    return f"sqlite:///{os.fspath(path)}"


def shown_storage(url: str) -> str:
    """How a storage is named in logs, errors and sweep.json: never with a password."""
    return redact(url)


def engine_kwargs(url: str, password: str | None = None) -> dict[str, Any]:
    """SQLAlchemy engine options: connect timeouts by dialect; ``password`` handed to the
    driver when it connects (the URL never holds it)."""
    dialect = url.partition(":")[0].partition("+")[0]
    connect: dict[str, Any] = {}
    if dialect == "sqlite" and password:  # sqlite3.connect() takes none: a TypeError
        raise ConfigError(
            f"TRAINING_SWEEP_STORAGE_PASSWORD is set, but the sweep's study storage "
            f"{shown_storage(url)} is a SQLite file, which takes no password: unset it, "
            "or set TRAINING_SWEEP_STORAGE to the database it is for (docs/sweeps.md)")
    if dialect == "sqlite":
        connect["timeout"] = SQLITE_BUSY_TIMEOUT_S
    elif dialect in ("postgresql", "mysql", "mariadb"):
        connect["connect_timeout"] = CONNECT_TIMEOUT_S
    if password:
        connect["password"] = password
    return {"connect_args": connect, "pool_pre_ping": True}


def open_storage(url: str, password: str | None = None) -> Any:
    """The Optuna storage at ``url`` (tables created on first use); StorageError naming
    the storage (without a password) when it cannot be reached or read."""
    import optuna

    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    options = engine_kwargs(url, password)  # a password SQLite cannot take: refused here
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=options)
    except Exception as exc:  # the driver's, SQLAlchemy's or Optuna's: all say "cannot"
        raise StorageError(
            f"the sweep's study storage {shown_storage(url)} cannot be opened: "
            f"{_reason(exc, password)}; check that the database runs and this worker "
            "reaches it (sweep.storage, docs/sweeps.md)") from None


def _reason(exc: BaseException, password: str | None) -> str:
    """The first line of the error, with the password (if any) blanked out."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}"
    if password:
        line = line.replace(password, "***")
    return line if len(line) <= 300 else f"{line[:300]}..."
