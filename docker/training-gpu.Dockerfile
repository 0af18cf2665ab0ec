# syntax=docker/dockerfile:1
#
# Training image for NVIDIA GPUs: the official TensorFlow GPU image (CUDA and cuDNN
# included) with this project installed from uv.lock. Build from the repository root:
#
#   docker build -f docker/training-gpu.Dockerfile -t keras-training:gpu .
#   docker run --rm --gpus all -v "$PWD/var:/data" keras-training:gpu \
#       train --config /data/runs/<run_id>.launch.json
#
# The host needs the NVIDIA driver and the NVIDIA Container Toolkit; the image brings
# everything else. Used as the image of GPU pods (launcher=kubernetes) and for runs
# started by hand; the compose stack's GPU Celery worker is docker/airflow.Dockerfile's
# `airflow-gpu` target instead, because a worker also needs Airflow's Celery parts.

ARG TF_IMAGE=tensorflow/tensorflow:2.21.0-gpu
FROM ${TF_IMAGE}

ARG UV_VERSION=0.13.8
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_COMPILE_BYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    UV_NO_CACHE=1 \
    UV_LINK_MODE=copy

# The lock was made for Python 3.11 and TensorFlow 2.21.0: stop here, not at run time,
# if the base image has anything else.
RUN python3 -c "import sys; from importlib.metadata import version as v; \
assert sys.version_info[:2] == (3, 11), f'need Python 3.11, base image has {sys.version}'; \
assert v('tensorflow') == '2.21.0', f'need tensorflow 2.21.0, base image has {v(\"tensorflow\")}'" \
 && python3 -m pip install --no-cache-dir "uv==${UV_VERSION}"

WORKDIR /opt/training
COPY pyproject.toml uv.lock README.md ./
# Every runtime package at the version (and hash) the lock records. The base image's
# TensorFlow is already the locked version, so it stays, and so do its CUDA libraries
# (they are not in the lock: `uv pip install` adds and replaces, it never removes).
RUN uv export --frozen --no-dev --no-emit-project --format requirements.txt \
        --output-file /tmp/requirements.txt \
 && uv pip install --system --python python3 --requirement /tmp/requirements.txt \
 && rm /tmp/requirements.txt

COPY training/ training/
COPY plugins/ plugins/
RUN uv pip install --system --python python3 --no-deps . \
 && python3 -m pip check \
 && useradd --create-home --uid 50000 --gid 0 training \
 && mkdir -p /data && chown 50000:0 /data

USER 50000
WORKDIR /data
ENTRYPOINT ["python3", "-m", "training"]
CMD ["--help"]
