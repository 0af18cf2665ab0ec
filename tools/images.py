"""``./dev images``: the project's images built here, offline, from docker/Dockerfile.

No image registry is reachable from the machines this project is developed and tested
on, so nothing can be pulled; the images are built from what can be had:

1. **A base image from Debian's own packages** (``bootstrap_base``): ``debootstrap
   --variant=minbase bookworm`` with Python 3.11 and its ``venv`` module (what the
   official ``python:3.11-slim-bookworm`` default of ``BASE_IMAGE`` provides), imported
   into the engine. The root file system is kept as a tarball named by its inputs (suite,
   packages, mirror), so a machine bootstraps once (about a minute) and a new engine
   imports it in seconds.
2. **A wheelhouse of the lock's own files** (``wheelhouse``): every file uv.lock names for
   the Airflow image (a superset of the training image), fetched by pip from the package
   index with the lock's hashes, kept under a name made from the lock, and linked into
   ``docker/wheelhouse/`` (the only place a build may read it from).
3. **The builds**: ``docker build --network none`` of the Dockerfile's ``training`` and
   ``airflow`` targets with ``BASE_IMAGE`` = that base, ``ACCELERATOR=cpu`` and
   ``OFFLINE=true``: the image a user builds differs only in those arguments. BuildKit's
   layer cache makes a rebuild of an unchanged tree take seconds.

The engine is ``tools.engine.DockerEngine`` (``DOCKER_HOST`` when set).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.engine import CACHE, DockerEngine
from tools.services import ServiceError, find_binary
from training import __version__

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
WHEELHOUSE = ROOT / "docker" / "wheelhouse"
SUITE = "bookworm"
MIRROR = os.environ.get("TRAINING_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PYTHON_PACKAGES = ("python3", "python3-venv", "ca-certificates")
UV_VERSION = "0.13.8"  # as ./dev and the Dockerfile's UV_VERSION
# uv's manylinux x86_64 wheel of that version (the images install uv from the wheelhouse)
UV_WHEEL_SHA256 = "e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984"
# Python versions the lock's markers are evaluated at: Debian bookworm's 3.11.2 and the
# official image's 3.11.x need different files (async-timeout below 3.11.3, soupsieve).
PYTHON_VERSIONS = ("3.11.2", "3.11.14")
# The machine's Python, with pip and the uv that ./dev installed (.venv has neither).
HOST_PYTHON = shutil.which("python3") or "python3"


@dataclass(frozen=True)
class Images:
    """The tags of one build: what the tests and a person run."""

    base: str
    training: str
    airflow: str


def _digest(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:12]


def bootstrap_base(engine: DockerEngine, include: Sequence[str] = PYTHON_PACKAGES,
                   name: str = "airflow-keras-training-base") -> str:
    """A Debian ``SUITE`` minbase image with ``include`` in ``engine``; its tag.

    The tag and the cached root file system are named by the inputs, so the same
    packages are bootstrapped once per machine and imported once per engine.
    """
    key = _digest(SUITE, "minbase", sorted(include), MIRROR)
    tag = f"{name}:{SUITE}-{key}"
    if engine.has_image(tag):
        return tag
    tarball = CACHE / "bases" / f"{SUITE}-{key}.tar"
    if not tarball.exists():
        debootstrap = find_binary("debootstrap", "/usr/sbin/debootstrap", package="debootstrap")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tarball.parent) as scratch:
            rootfs = Path(scratch) / "rootfs"
            print(f"bootstrapping Debian {SUITE} ({', '.join(include)}) ...", file=sys.stderr)
            subprocess.run([debootstrap, "--variant=minbase", f"--include={','.join(include)}",
                            SUITE, str(rootfs), MIRROR], check=True, stdout=subprocess.DEVNULL)
            for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
                shutil.rmtree(rootfs / cache, ignore_errors=True)
                (rootfs / cache).mkdir(parents=True)
            partial = tarball.with_suffix(".partial")
            subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial),
                            "."], check=True)
            partial.rename(tarball)
    with open(tarball, "rb") as stream:
        engine.docker("import", "-", tag, stdin=stream)
    return tag


def _lock_id() -> str:
    return hashlib.sha256((ROOT / "uv.lock").read_bytes()
                          + (ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]


def _requirements() -> list[str]:
    """The Airflow image's requirement lines, each kept when its marker holds for any
    Python the images may have (``PYTHON_VERSIONS``), its marker then dropped."""
    from packaging.markers import Marker, default_environment

    exported = subprocess.run(
        [HOST_PYTHON, "-m", "uv", "export", "--frozen", "--no-dev", "--no-emit-project",
         "--extra", "airflow", "--format", "requirements.txt", "--quiet"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    lines, current = [], ""
    for raw in exported.splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        current += raw.rstrip("\\").rstrip() + " "
        if raw.endswith("\\"):
            continue
        spec, _, hashes = current.partition(" --hash")
        requirement, _, marker = spec.partition(";")
        env = default_environment()
        if not marker.strip() or any(
            Marker(marker).evaluate({**env, "python_full_version": v}) for v in PYTHON_VERSIONS
        ):
            lines.append(f"{requirement.strip()} --hash{hashes}".strip())
        current = ""
    lines.append(f"uv=={UV_VERSION} --hash=sha256:{UV_WHEEL_SHA256}")
    return lines


def _batches(lines: list[str]) -> list[list[str]]:
    """Requirement lines split so that no batch names a package twice (pip refuses a
    double requirement; two Pythons may need two versions of one package)."""
    batches: list[list[str]] = []
    for line in lines:
        name = line.split("==", 1)[0].strip().lower()
        home = next((b for b in batches if all(not x.lower().startswith(f"{name}==")
                                              for x in b)), None)
        if home is None:
            batches.append(home := [])
        home.append(line)
    return batches


def cached_wheelhouse() -> Path:
    """Where the lock's files for the images are kept (complete once ``.complete`` is)."""
    return CACHE / "wheelhouse" / _lock_id()


def wheelhouse() -> Path:
    """The lock's files for the images, fetched once per lock; linked into the context."""
    target = cached_wheelhouse()
    if not (target / ".complete").exists():
        target.mkdir(parents=True, exist_ok=True)
        print(f"fetching the lock's wheels into {target} ...", file=sys.stderr)
        for batch in _batches(_requirements()):
            with tempfile.NamedTemporaryFile("w", suffix=".txt") as reqs:
                reqs.write("\n".join(batch) + "\n")
                reqs.flush()
                # Every file exactly as locked (an sdist stays an sdist: its hash is the
                # lock's; the build makes the wheel).
                subprocess.run([HOST_PYTHON, "-m", "pip", "download", "--quiet",
                                "--no-deps", "--require-hashes", "--dest", str(target),
                                "-r", reqs.name], check=True,
                               env={**os.environ, "PIP_CONFIG_FILE": os.devnull,
                                    "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        (target / ".complete").write_text(_lock_id())
    for old in WHEELHOUSE.iterdir():
        if old.name != "README.md":
            old.unlink()
    for wheel in target.iterdir():
        if wheel.name != ".complete":
            try:
                os.link(wheel, WHEELHOUSE / wheel.name)
            except OSError:  # another file system
                shutil.copy2(wheel, WHEELHOUSE / wheel.name)
    return target


def build(engine: DockerEngine, base: str, accelerator: str = "cpu") -> Images:
    """Both targets of docker/Dockerfile, offline, on ``base``."""
    tags = Images(base=base, training=f"airflow-keras-training:{__version__}-{accelerator}",
                  airflow=f"airflow-keras-training-airflow:{__version__}-{accelerator}")
    for target, tag in (("training", tags.training), ("airflow", tags.airflow)):
        print(f"building {tag} (target {target}) ...", file=sys.stderr)
        done = engine.docker(
            "build", "--file", str(DOCKERFILE), "--target", target, "--network", "none",
            "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"ACCELERATOR={accelerator}",
            "--build-arg", "OFFLINE=true", "--tag", tag, "--progress", "plain", str(ROOT),
            check=False, timeout=1800)
        if done.returncode != 0:
            raise ServiceError(f"docker build of {target} failed:\n"
                               f"{(done.stdout + done.stderr)[-4000:]}")
    return tags


def build_all(engine: DockerEngine) -> Images:
    """Base, wheelhouse and both images: what ``./dev images`` and the tests call."""
    base = bootstrap_base(engine)
    wheelhouse()
    return build(engine, base)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./dev images",
        description="Build the training and Airflow images here, offline (CPU builds).")
    parser.parse_args(argv)
    engine = DockerEngine()
    try:
        engine.ensure()
        images = build_all(engine)
    except (ServiceError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.stop()
    print(f"built, in the engine at {engine.host}:\n"
          f"  training  {images.training}\n  airflow   {images.airflow}\n"
          f"  (base     {images.base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
