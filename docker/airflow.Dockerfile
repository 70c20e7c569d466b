# syntax=docker/dockerfile:1
# The Airflow image (scheduler, triggerer, api-server, dag-processor, workers): the official image plus
# ringflow with its `airflow` extra and the CPU build of torch, without Horovod.
#
# Training runs in the training image, in MPIJob pods. The Airflow workers still need torch for one step:
# evaluate, which scores the final checkpoint on the held-out split (a CPU forward pass). From PyPI, torch
# pulls in gigabytes of CUDA libraries; the CPU wheel index has the same version without them. So:
#   1. docker/requirements_without_torch.py lists ringflow's requirements from pyproject.toml minus torch
#      (and minus apache-airflow, which the base image has);
#   2. pip installs those plus torch==TORCH_VERSION from the CPU index, with apache-airflow pinned in the
#      same command so pip can never move it;
#   3. ringflow itself goes in with --no-deps.
#
# Build from the repository root:
#   docker build -f docker/airflow.Dockerfile -t REGISTRY/ringflow-airflow:0.1.0 .
# AIRFLOW_VERSION, PYTHON_VERSION and TORCH_VERSION must equal versions.env (tests/docker checks it).
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1
# The official image installs Python packages as the airflow user (never as root).
USER airflow
COPY --chown=airflow:0 pyproject.toml README.md versions.env /opt/ringflow/
COPY --chown=airflow:0 docker/requirements_without_torch.py /opt/ringflow/docker/
COPY --chown=airflow:0 training /opt/ringflow/training
COPY --chown=airflow:0 operators /opt/ringflow/operators
# The DAGs ship in the image: what is deployed is exactly what was built and tested.
COPY --chown=airflow:0 dags /opt/airflow/dags
RUN python /opt/ringflow/docker/requirements_without_torch.py /opt/ringflow/pyproject.toml > /tmp/ringflow-requirements.txt \
 && pip install --extra-index-url "${TORCH_INDEX_URL}" "apache-airflow==${AIRFLOW_VERSION}" "torch==${TORCH_VERSION}" \
        -r /tmp/ringflow-requirements.txt \
 && pip install --no-deps /opt/ringflow \
 && python -c "import ringflow.training.core.backends.kubernetes.backend, ringflow.training.core.backends.job_spec, ringflow.training.core.evaluate" \
 && ! python -c "import horovod" 2>/dev/null
