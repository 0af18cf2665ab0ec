# syntax=docker/dockerfile:1
#
# Airflow image for the compose stack (and any Celery/Kubernetes deployment): the
# official Airflow 3.3.2 image with this project, its DAG and its plugin.
#
#   docker build -f docker/airflow.Dockerfile --target airflow -t keras-airflow:3.3.2 .
#   docker build -f docker/airflow.Dockerfile --target airflow-gpu -t keras-airflow:3.3.2-gpu .
#
# Where the versions come from:
# * Airflow's own parts that the project does not lock (Celery executor, Postgres and
#   Redis clients, the FAB auth manager) come from the official image, which the Airflow
#   project builds against its constraints file for 3.3.2 (Airflow's way of making
#   installs reproducible).
# * Everything the project runs (Airflow 3.3.2 and its amazon/cncf-kubernetes/standard
#   providers, TensorFlow, Keras, tfds, boto3, matplotlib, ...) is installed from
#   uv.lock: exact versions, hash-checked downloads. Where the lock and the image's
#   constraints disagree, the lock wins, since that is what the test suite ran with.
# * `pip check` ends each stage: a conflict between the two fails the build, not a run.
#
# The `airflow-gpu` target adds the CUDA libraries for TensorFlow (`tensorflow[and-cuda]`,
# the NVIDIA wheels TensorFlow's docs name); those wheels are resolved at build time
# within TensorFlow's bounds, the rest stays at the lock's versions.

ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_IMAGE} AS airflow

ARG UV_VERSION=0.13.8
ENV PYTHONDONTWRITEBYTECODE=1 \
    UV_COMPILE_BYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    UV_NO_CACHE=1 \
    UV_LINK_MODE=copy \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/airflow/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/airflow/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    TRAINING_DATA_DIR=/opt/airflow/training

# The image's user (airflow, uid 50000) owns the image's virtualenv ($VIRTUAL_ENV,
# /home/airflow/.local); `uv pip install` installs into it.
USER airflow
RUN python -m pip install --no-cache-dir "uv==${UV_VERSION}"

WORKDIR /opt/project
COPY --chown=airflow:0 pyproject.toml uv.lock README.md ./
RUN uv export --frozen --no-dev --extra airflow --no-emit-project --format requirements.txt \
        --output-file /tmp/requirements.txt \
 && uv pip install --requirement /tmp/requirements.txt \
 && rm /tmp/requirements.txt

COPY --chown=airflow:0 training/ training/
COPY --chown=airflow:0 plugins/ plugins/
COPY --chown=airflow:0 dags/ /opt/airflow/dags/
COPY --chown=airflow:0 plugins/ /opt/airflow/plugins/
# The project itself (its airflow.policy entry point routes `train` to the GPU queue);
# the shared data directory exists in the image so a fresh named volume mounted there
# starts owned by airflow.
RUN uv pip install --no-deps . \
 && python -m pip check \
 && mkdir -p "${TRAINING_DATA_DIR}"

WORKDIR /opt/airflow


FROM airflow AS airflow-gpu

WORKDIR /opt/project
RUN uv export --frozen --no-dev --extra airflow --no-emit-project --no-hashes \
        --format requirements.txt --output-file /tmp/constraints.txt \
 && uv pip install --constraint /tmp/constraints.txt "tensorflow[and-cuda]==2.21.0" \
 && rm /tmp/constraints.txt \
 && python -m pip check

WORKDIR /opt/airflow
