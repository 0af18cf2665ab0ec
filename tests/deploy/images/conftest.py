"""Fixtures of the image tests: the project's images, built once per session.

``images`` runs the README's ``./dev images`` exactly as written, in a fresh copy of the
tree with a new user's environment (the Debian base and the wheelhouse are cached by
their inputs under ``~/.cache/airflow-keras-training``, BuildKit's layer cache keeps the
rest, so only a machine's first build takes minutes), reads the tags it prints, then
starts the same engine (``tools.engine.DockerEngine``) for the tests and stops it at the
end. Every test here runs containers of those images on networks of its own.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

import pytest
from support.fresh import fresh_copy, new_user_env

from tools.engine import DockerEngine
from tools.images import Images

DEV_IMAGES = "./dev images"  # as the README writes it


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
def images(tmp_path_factory: pytest.TempPathFactory):
    clone = fresh_copy(tmp_path_factory.mktemp("images") / "clone")
    done = subprocess.run(["bash", "-c", DEV_IMAGES], cwd=clone, env=new_user_env(),
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, f"{DEV_IMAGES}: exit {done.returncode}\n{done.stderr[-4000:]}"
    built = dict(re.findall(r"^  \(?(training|airflow|base) +(\S+?)\)?$", done.stdout, re.M))
    tags = Images(base=built["base"], training=built["training"], airflow=built["airflow"])
    engine = DockerEngine().ensure()
    try:
        assert all(engine.has_image(tag) for tag in (tags.base, tags.training, tags.airflow))
        yield BuiltImages(engine, tags)
    finally:
        engine.stop()
