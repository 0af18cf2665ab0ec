"""The offline build's guard: every file of the wheelhouse is checked against uv.lock's
hashes, so a wheel changed on disk (or swapped for another of the same name) fails the
build instead of landing in an image.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tools.images import DOCKERFILE, ROOT, cached_wheelhouse


@pytest.mark.slow
def test_a_tampered_wheel_in_the_wheelhouse_fails_the_build(images, tmp_path):
    context = tmp_path / "context"
    (context / "docker" / "wheelhouse").mkdir(parents=True)
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy2(ROOT / name, context / name)
    shutil.copy2(DOCKERFILE, context / "docker" / "Dockerfile")
    shutil.copy2(DOCKERFILE.with_name("Dockerfile.dockerignore"),
                 context / "docker" / "Dockerfile.dockerignore")
    wheels = cached_wheelhouse()  # what ./dev images fetched and checked in the fixture
    assert (wheels / ".complete").exists()
    victim = next(wheels.glob("six-*.whl"))
    for wheel in wheels.iterdir():
        if wheel.name == ".complete":
            continue
        target = context / "docker" / "wheelhouse" / wheel.name
        if wheel == victim:  # a copy with one byte more: same name, other content
            target.write_bytes(wheel.read_bytes() + b"\0")
        else:
            os.link(wheel, target)

    done = images.docker(
        "build", "--file", str(context / "docker" / "Dockerfile"), "--target", "locked",
        "--network", "none", "--build-arg", f"BASE_IMAGE={images.base}",
        "--build-arg", "OFFLINE=true", "--progress", "plain", str(context),
        check=False, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "Hash mismatch" in output and "six" in output, output[-3000:]
