"""The production stack's servers as local processes: PostgreSQL, Redis (and SeaweedFS).

``./dev stack`` runs them beside Airflow, and the tests start the same classes, so what
a team tries on one machine is what is tested. Each server is one child process in a
session of its own, on 127.0.0.1 only, with its data and log under one directory; it can
be stopped (``stop``: the server's own clean shutdown), killed (``kill``: SIGKILL, for
fault injection) and started again on the same data.

- ``PostgreSQL``: Debian's ``postgresql`` binaries. ``initdb`` refuses to run as root, so
  as root the server runs as the ``postgres`` user (its cluster under
  ``/var/lib/postgresql/dev-stacks/`` when that user cannot reach the directory given);
  loopback TCP connections need a password (scram-sha-256), the socket directory is the
  cluster's own.
- ``Redis``: Debian's ``redis-server``, no persistence, ``requirepass``.
- ``SeaweedFS`` (the S3 server) is ``seaweedfs.py``, on the same ``Service``.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tools.standalone import log_tail

HOST = "127.0.0.1"


class ServiceError(RuntimeError):
    """A server that is not installed, did not start, or refused what it was given."""


def free_port_block(count: int, start: int = 20000, stop: int = 60000) -> int:
    """A port P with P .. P+count-1 all free on 127.0.0.1 (a guess; a race can lose it)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        first = probe.getsockname()[1]
    # Then a scan from a start that differs by process, so that two test workers looking
    # at the same moment do not try the same blocks in the same order.
    candidates = [first, *range(start + (os.getpid() * 37) % 1000 * 20, stop, count)]
    for base in candidates:
        if base + count > 65535:
            continue
        if all(port_is_free(base + i) for i in range(count)):
            return base
    raise ServiceError(f"no {count} consecutive free ports on {HOST}")


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


class Service:
    """One server process: ``start`` until it answers, ``stop``, ``kill``."""

    name = "service"
    stop_signal = signal.SIGTERM

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = Path(root), port
        self.log = self.root / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None

    # What a subclass says.
    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def prepare(self) -> None:
        """First-start set-up (data directory, config files)."""

    def popen_options(self) -> dict:
        return {}

    # The process.
    def start(self, timeout: float = 60.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.prepare()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, **self.popen_options())
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None:
                raise ServiceError(f"{self.name} exited with code {self.proc.returncode} at "
                                   f"start; last lines of {self.log}:\n{log_tail(self.log, 15)}")
            if time.monotonic() > deadline:
                self.kill()
                raise ServiceError(f"{self.name} did not answer on {HOST}:{self.port} in "
                                   f"{timeout:.0f} s; log: {self.log}")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, self.stop_signal)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server's whole process group (a crash, for fault injection)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def find_binary(name: str, *globs: str, package: str) -> str:
    found = shutil.which(name) or next(
        (p for pattern in globs for p in sorted(glob.glob(pattern), reverse=True)), None)
    if not found:
        raise ServiceError(f"{name} is not installed: install Debian's {package} "
                           f"(apt-get install -y {package})")
    return found


class PostgreSQL(Service):
    """A PostgreSQL cluster in ``root/data``, a database and a password-protected user."""

    name = "postgres"
    stop_signal = signal.SIGINT  # postgres' "fast" shutdown

    def __init__(self, root: Path, port: int, *, password: str, user: str = "airflow",
                 database: str = "airflow", databases: tuple[str, ...] = ()) -> None:
        super().__init__(root, port)
        self.password, self.user, self.database = password, user, database
        self.databases = databases  # more databases of the user's (the sweeps' studies)
        self.data, self.sockets = self.root / "data", self.root / "sockets"
        self.bin = Path(find_binary("initdb", "/usr/lib/postgresql/*/bin/initdb",
                                package="postgresql")).resolve().parent

    @property
    def url(self) -> str:
        """The SQLAlchemy URL Airflow uses (sync driver psycopg2)."""
        return (f"postgresql+psycopg2://{self.user}:{self.password}@{HOST}:{self.port}/"
                f"{self.database}")

    def _owner(self) -> dict:
        if os.getuid() != 0:
            return {}
        account = pwd.getpwnam("postgres")
        return {"user": account.pw_uid, "group": account.pw_gid}

    def popen_options(self) -> dict:
        return self._owner()

    def _home(self) -> Path:
        """Where the cluster lives: ``root``, unless the ``postgres`` user cannot reach it
        (a tree under a 0700 home or temp directory, as root): then a directory of its
        own under ``/var/lib/postgresql``, named after ``root``, linked from ``root``."""
        owner = self._owner()
        if not owner or subprocess.run(["test", "-x", os.fspath(self.root)], check=False,
                                       **owner).returncode == 0:
            return self.root
        digest = hashlib.sha256(os.fspath(self.root.resolve()).encode()).hexdigest()[:16]
        home = Path(pwd.getpwnam("postgres").pw_dir) / "dev-stacks" / digest
        link = self.root / "data"
        if not link.is_symlink():  # a new root: a cluster left there belonged to an old one
            shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True, exist_ok=True)
        for path in (home.parent, home):
            os.chown(path, owner["user"], owner["group"])
        if not link.is_symlink():
            link.symlink_to(home / "data")
        return home

    def prepare(self) -> None:
        home = self._home()
        self.data, self.sockets = home / "data", home / "sockets"
        self.sockets.mkdir(parents=True, exist_ok=True)
        owner = self._owner()
        if owner:
            for path in (home, self.sockets):
                os.chown(path, owner["user"], owner["group"])
        if (self.data / "PG_VERSION").exists():
            return
        secret = home / "superuser-password"
        secret.write_text(self.password + "\n")
        secret.chmod(0o600)
        if owner:
            os.chown(secret, owner["user"], owner["group"])
        try:
            subprocess.run(
                [os.fspath(self.bin / "initdb"), "-D", os.fspath(self.data), "-U", "postgres",
                 "-E", "UTF8", "--auth-local=trust", "--auth-host=scram-sha-256",
                 f"--pwfile={secret}"],
                check=True, capture_output=True, **owner)
        except subprocess.CalledProcessError as exc:
            raise ServiceError("initdb failed: " + exc.stderr.decode(errors="replace")) from None
        finally:
            secret.unlink()

    def command(self) -> list[str]:
        return [os.fspath(self.bin / "postgres"), "-D", os.fspath(self.data),
                "-p", str(self.port), "-k", os.fspath(self.sockets),
                "-c", f"listen_addresses={HOST}", "-c", "max_connections=200"]

    def psql(self, sql: str) -> str:
        """Run SQL as the superuser over the private socket."""
        result = subprocess.run(
            [os.fspath(self.bin / "psql"), "-h", os.fspath(self.sockets), "-p", str(self.port),
             "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-tAc", sql],
            capture_output=True, text=True, **self._owner())
        if result.returncode != 0:
            raise ServiceError(f"psql failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def ready(self) -> bool:
        return (self.sockets / f".s.PGSQL.{self.port}").exists() and accepts(self.port) \
            and subprocess.run([os.fspath(self.bin / "pg_isready"), "-q", "-h",
                                os.fspath(self.sockets), "-p", str(self.port),
                                "-U", "postgres"],
                               check=False).returncode == 0

    def start(self, timeout: float = 60.0) -> None:
        """Start the cluster; the user and its databases (``database``, then
        ``databases``, owned by it) are made when they do not exist (the first start, one
        that stopped between ``initdb`` and them, or a cluster older than a database)."""
        super().start(timeout)
        if not self.psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{self.user}'"):
            quoted = self.password.replace("'", "''")
            self.psql(f"CREATE ROLE {self.user} LOGIN PASSWORD '{quoted}'")
        for name in (self.database, *self.databases):
            if not self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'"):
                self.psql(f"CREATE DATABASE {name} OWNER {self.user}")


class Redis(Service):
    """Redis with a password and no persistence (the Celery broker)."""

    name = "redis"

    def __init__(self, root: Path, port: int, *, password: str) -> None:
        super().__init__(root, port)
        self.password = password
        self.binary = find_binary("redis-server", package="redis-server")

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{HOST}:{self.port}/0"

    def command(self) -> list[str]:
        return [self.binary, "--bind", HOST, "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", os.fspath(self.root),
                "--requirepass", self.password, "--protected-mode", "yes"]

    def ready(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=1) as sock:
                secret = self.password.encode()
                sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n*1\r\n$4\r\nPING\r\n"
                             % (len(secret), secret))
                answer = b""
                while answer.count(b"\r\n") < 2:
                    chunk = sock.recv(256)
                    if not chunk:
                        return False
                    answer += chunk
                return answer.endswith(b"+PONG\r\n")
        except OSError:
            return False
