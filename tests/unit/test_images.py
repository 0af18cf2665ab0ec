"""tools/images.py without an engine: what goes into the offline wheelhouse.

The images may run Debian bookworm's Python (3.11.2) or the official image's (3.11.x):
the lock's markers differ between them (``async-timeout`` below 3.11.3, two versions of
``soupsieve`` on either side of 3.11.5), so the wheelhouse holds both, and never a
Windows-only package. pip refuses a requirement named twice, so such pairs are fetched
in separate batches.
"""

from __future__ import annotations

from tools import images


def _names(lines: list[str]) -> list[str]:
    return [line.split(" ", 1)[0] for line in lines]


def test_the_wheelhouse_covers_every_python_the_images_may_have():
    pinned = _names(images._requirements())
    assert "async-timeout==5.0.1" in pinned  # only below 3.11.3: Debian's 3.11.2
    assert {"soupsieve==2.10", "soupsieve==4.1.3"} <= set(pinned)
    assert not any(name.startswith("colorama==") for name in pinned)  # win32 only
    assert f"uv=={images.UV_VERSION}" in pinned
    assert any(name.startswith("tensorflow==") for name in pinned)
    assert any(name.startswith("apache-airflow==") for name in pinned)
    assert all(" --hash=sha256:" in line and ";" not in line
               for line in images._requirements())


def test_no_batch_names_a_package_twice():
    lines = ["a==1 --hash=sha256:1", "b==1 --hash=sha256:2", "a==2 --hash=sha256:3",
             "a==3 --hash=sha256:4"]
    batches = images._batches(lines)
    assert sorted(line for batch in batches for line in batch) == sorted(lines)
    for batch in batches:
        names = [line.split("==")[0] for line in batch]
        assert len(names) == len(set(names)), batch
    assert len(batches) == 3
