# syntax=docker/dockerfile:1
# The training image: what every MPIJob pod runs (the launcher runs mpirun, the workers run sshd), and every
# TrainJob pod (a TensorFlow one on the TF venv, /opt/tensorflow: TENSORFLOW=0 leaves it out).
# Python, torch and Horovod as on a developer machine (scripts/setup.sh), OpenMPI and an sshd set up the
# way the Kubeflow MPI Operator expects, and ringflow. Runs as the non-root user mpiuser (uid 1000).
#
# Build from the repository root (docker/training.Dockerfile.dockerignore keeps .venv and friends out):
#   docker build -f docker/training.Dockerfile -t REGISTRY/ringflow-training:0.1.0 .
# Without Docker or a registry (what scripts/build-training-image.sh does, with buildah): a debootstrapped
# Debian base as BASE_IMAGE, wheels from docker/wheelhouse/ and a CA bundle as a build secret:
#   buildah bud --isolation chroot -f docker/training.Dockerfile --ignorefile docker/training.Dockerfile.dockerignore \
#     --build-arg BASE_IMAGE=localhost/ringflow-base:debian-12.15-minbase \
#     --format docker --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt -t localhost/ringflow-training:dev .
# docker/wheelhouse/ (empty in git): a torch-${TORCH_VERSION} wheel there, with its dependencies, is
# installed with --no-index instead of from TORCH_INDEX_URL (air-gapped builds; for GPU=1 put the CUDA
# wheel there). On CPU builds a horovod-${HOROVOD_VERSION} wheel there is used instead of compiling Horovod;
# it must come from docker/build-horovod.sh against the same torch, Python minor and OpenMPI (e.g. a
# Debian bookworm host's ~/.cache/ringflow/wheels, which scripts/build-training-image.sh links in).
# ca_bundle secret: a CA bundle pip uses instead of its own (behind a TLS-intercepting proxy). A secret is
# mounted for one RUN only, so it is in no layer and never in the image.
# GPU variant (CUDA base, CUDA torch wheels, Horovod's allreduce on NCCL):
#   docker build -f docker/training.Dockerfile -t REGISTRY/ringflow-training:0.1.0-cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04 --build-arg GPU=1 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 .
#
# Versions: the defaults below must equal versions.env (tests/docker checks it); override them only
# together with versions.env.
ARG PYTHON_VERSION=3.11
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG PYTHON_VERSION
ARG TORCH_VERSION=2.13.0
ARG HOROVOD_VERSION=0.28.1
ARG GPU=0
# CPU wheels by default: the PyPI torch wheel pulls in gigabytes of CUDA libraries a CPU node never uses.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# A CUDA base has no Python of ours: take the distribution's python${PYTHON_VERSION} (Ubuntu 22.04 ships 3.11).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates g++ make libopenmpi-dev openmpi-bin \
 && if ! command -v "python${PYTHON_VERSION}" >/dev/null; then \
      apt-get install -y --no-install-recommends "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-dev" \
        "python${PYTHON_VERSION}-venv"; \
    fi \
 && rm -rf /var/lib/apt/lists/*
# One virtual environment at a fixed path, copied whole into the runtime stage.
RUN "python${PYTHON_VERSION}" -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/wheelhouse/ /wheelhouse/
# Each RUN that reaches PyPI trusts the ca_bundle secret when one is given (see the header).
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && pip install --upgrade pip wheel setuptools \
 && pip install cmake packaging psutil pyyaml cloudpickle \
 && if ls /wheelhouse/torch-"${TORCH_VERSION}"[-+]*.whl >/dev/null 2>&1; then \
      pip install --no-index --find-links /wheelhouse "torch==${TORCH_VERSION}"; \
    else \
      pip install --index-url "${TORCH_INDEX_URL}" --extra-index-url https://pypi.org/simple "torch==${TORCH_VERSION}"; \
    fi
# Horovod exactly as scripts/setup.sh builds it (its patches: C++17, gloo-op-timeout,
# gloo-finalize-process-sets; MPI and Gloo controllers); on CPU builds a wheel from the wheelhouse is taken as
# already built (build-horovod.sh skips the build when OUT_DIR has one carrying its patches, else rebuilds);
# GPU builds always compile, with NCCL, and fail here unless Horovod came out NCCL-built (a rank on a GPU
# refuses a Horovod without it: training/rank/devices.py).
COPY versions.env /src/versions.env
COPY docker/build-horovod.sh /src/docker/build-horovod.sh
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && mkdir -p /wheels \
 && if [ "${GPU}" = "1" ]; then \
      export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=/usr/local/cuda HOROVOD_NCCL_LINK=SHARED; \
    else \
      cp /wheelhouse/horovod-"${HOROVOD_VERSION}"-*.whl /wheels/ 2>/dev/null || true; \
    fi \
 && PYTHON=/opt/venv/bin/python bash /src/docker/build-horovod.sh /wheels \
 && pip install "/wheels/horovod-${HOROVOD_VERSION}-"*.whl \
 && horovodrun --check-build \
 && if [ "${GPU}" = "1" ]; then \
      python -c "import horovod.torch as hvd; assert hvd.nccl_built(), 'Horovod was built without NCCL'"; \
    fi
COPY pyproject.toml README.md /src/
COPY training /src/training
COPY operators /src/operators
# torch is already installed at the pinned version, so pip keeps it (the CPU or CUDA build chosen above).
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && pip install --find-links /wheelhouse /src && python -c "import ringflow.training, horovod.torch"
# The TensorFlow engine's venv, /opt/tensorflow (TrainJobSettings.tensorflow_python): tensorflow-cpu and
# ringflow's core requirements minus torch, ringflow itself with --no-deps. A venv of its own because a
# TensorFlow rank never imports torch and the two pin different numpy/protobuf ranges. Last in this stage, so
# the torch and Horovod layers above stay cached. TENSORFLOW=0 leaves it empty (about 1.5 GB less) for images
# that never run a TensorFlow TrainJob, as the multihost tests' MPIJob image. tensorflow-cpu on GPU=1 builds
# too: TensorFlow on GPUs is not covered.
ARG TENSORFLOW=1
ARG TENSORFLOW_VERSION=2.21.0
# tf-keras for users' Keras scripts (model.fit under MultiWorkerMirroredStrategy, README "Your own training
# script"): --no-deps, since it requires the `tensorflow` wheel, which would replace tensorflow-cpu.
ARG TF_KERAS_VERSION=2.21.0
COPY docker/requirements_without_torch.py /src/docker/requirements_without_torch.py
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && mkdir -p /opt/tensorflow \
 && if [ "${TENSORFLOW}" = "1" ]; then \
      "python${PYTHON_VERSION}" -m venv /opt/tensorflow \
      && python /src/docker/requirements_without_torch.py --core /src/pyproject.toml > /tmp/tf-requirements.txt \
      && /opt/tensorflow/bin/pip install --find-links /wheelhouse "tensorflow-cpu==${TENSORFLOW_VERSION}" \
           -r /tmp/tf-requirements.txt \
      && /opt/tensorflow/bin/pip install --no-deps /src "tf-keras==${TF_KERAS_VERSION}" \
      && /opt/tensorflow/bin/python -c "import tensorflow, tf_keras, ringflow.training.core.backends.kubernetes.tf_pod"; \
    fi

FROM ${BASE_IMAGE}
ARG PYTHON_VERSION
ARG SSH_PORT=2222
ARG MPI_UID=1000
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates openmpi-bin libopenmpi3 openssh-server openssh-client \
 && if ! command -v "python${PYTHON_VERSION}" >/dev/null; then \
      apt-get install -y --no-install-recommends "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv"; \
    fi \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/tensorflow /opt/tensorflow
# mpirun -x forwards PATH, LD_LIBRARY_PATH and PYTHONPATH to every rank, so all three must exist.
ENV PATH=/opt/venv/bin:$PATH LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} PYTHONPATH=${PYTHONPATH:-} \
    PYTHONUNBUFFERED=1
# SSH as kubeflow/mpi-operator's base image sets it up: no host key prompts (workers are new every run),
# no known_hosts writes (the .ssh folder is a read-only Secret mount), sshd and ssh on SSH_PORT.
RUN mkdir -p /var/run/sshd \
 && sed -i "s/[ #]\(.*StrictHostKeyChecking \).*/ \1no/g" /etc/ssh/ssh_config \
 && echo "    UserKnownHostsFile /dev/null" >> /etc/ssh/ssh_config \
 && sed -i "s/[ #]\(.*Port \).*/ \1${SSH_PORT}/g" /etc/ssh/ssh_config \
 && sed -i "s/#\(StrictModes \).*/\1no/g" /etc/ssh/sshd_config \
 && sed -i "s/#\(Port \).*/\1${SSH_PORT}/g" /etc/ssh/sshd_config \
 && useradd --create-home --uid "${MPI_UID}" --user-group --shell /bin/bash mpiuser
COPY --chown=mpiuser:mpiuser docker/sshd_config /home/mpiuser/.sshd_config
RUN echo "Port ${SSH_PORT}" >> /home/mpiuser/.sshd_config \
 && python -c "import ringflow.training, horovod.torch" && mpirun --version
USER mpiuser
WORKDIR /home/mpiuser
EXPOSE ${SSH_PORT}
