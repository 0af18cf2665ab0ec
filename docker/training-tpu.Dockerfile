# syntax=docker/dockerfile:1
#
# Training image for Cloud TPU VMs (and GKE TPU node pools): Python 3.11 slim, this
# project from uv.lock, and TensorFlow's TPU build instead of the plain wheel.
#
#   docker build -f docker/training-tpu.Dockerfile -t keras-training:tpu .
#   docker run --rm --privileged --net=host keras-training:tpu \
#       train --config /data/runs/<run_id>.launch.json --accelerator tpu
#
# What is NOT verified (no TPU and no network to Google's index were available when
# this was written; see docs/reports-and-docker.md):
# * TensorFlow's TPU docs install `tensorflow-tpu` (the TPU build of the same release)
#   from the libtpu-tf-releases index, which also carries the matching `libtpu`. PyPI
#   had tensorflow-tpu only up to 2.20.0 at the time; 2.21.0 is expected on that index.
# * tensorflow-tpu's own metadata only says `libtpu~=0.0.14`; the libtpu that matches a
#   release is the one on the index. Set LIBTPU_VERSION once you know it, to pin it.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG UV_VERSION=0.13.8
ARG TF_VERSION=2.21.0
ARG LIBTPU_VERSION=
ARG LIBTPU_INDEX=https://storage.googleapis.com/libtpu-tf-releases/index.html
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_COMPILE_BYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    UV_NO_CACHE=1 \
    UV_LINK_MODE=copy

RUN python -m pip install --no-cache-dir "uv==${UV_VERSION}"

WORKDIR /opt/training
COPY pyproject.toml uv.lock README.md ./
# The lock without the plain `tensorflow` wheel (tensorflow-tpu provides the same
# `tensorflow` module; both would overwrite each other's files), then tensorflow-tpu
# with the lock as constraints, so every shared dependency stays at its locked version
# and only libtpu is added.
RUN uv export --frozen --no-dev --no-emit-project --no-emit-package tensorflow \
        --format requirements.txt --output-file /tmp/requirements.txt \
 && uv export --frozen --no-dev --no-emit-project --no-hashes \
        --format requirements.txt --output-file /tmp/constraints.txt \
 && uv pip install --system --requirement /tmp/requirements.txt \
 && uv pip install --system --constraint /tmp/constraints.txt \
        --find-links "${LIBTPU_INDEX}" \
        "tensorflow-tpu==${TF_VERSION}" ${LIBTPU_VERSION:+"libtpu==${LIBTPU_VERSION}"} \
 && rm /tmp/requirements.txt /tmp/constraints.txt \
 && uv pip show --system libtpu

COPY training/ training/
COPY plugins/ plugins/
RUN uv pip install --system --no-deps . \
 && python -m pip check \
 && useradd --create-home --uid 50000 --gid 0 training \
 && mkdir -p /data && chown 50000:0 /data

USER 50000
WORKDIR /data
ENTRYPOINT ["python", "-m", "training"]
CMD ["--help"]
