"""Fixtures of the image tests: the project's images, built once per session.

``images`` starts the project's own Docker engine (``tools.engine.DockerEngine``), builds
the training and Airflow images from docker/Dockerfile exactly as ``./dev images`` does
(``tools.images.build_all``: the Debian base and the wheelhouse cached by their inputs,
BuildKit's layer cache for the rest) and stops the engine at the end. Every test here
runs containers of those images on networks of its own.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest

from tools.engine import DockerEngine
from tools.images import Images, build_all


@dataclass(frozen=True)
class BuiltImages:
    """The built tags and the engine that holds them."""

    engine: DockerEngine
    tags: Images

    @property
    def training(self) -> str:
        return self.tags.training

    @property
    def airflow(self) -> str:
        return self.tags.airflow

    @property
    def base(self) -> str:
        return self.tags.base

    @property
    def env(self) -> dict[str, str]:
        return self.engine.env

    def docker(self, *args: str, check: bool = True, capture: bool = True,
               timeout: float | None = None) -> subprocess.CompletedProcess:
        return self.engine.docker(*args, check=check, capture=capture, timeout=timeout)


@pytest.fixture(scope="session")
def images():
    engine = DockerEngine().ensure()
    try:
        yield BuiltImages(engine, build_all(engine))
    finally:
        engine.stop()
