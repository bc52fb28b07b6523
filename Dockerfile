# syntax=docker/dockerfile:1
# Two images from one file, each installing the pinned dependencies of its pyproject.toml extra
# (the same pins make and CI install):
#   docker build --target operator -t ghcr.io/ddpjob/operator:0.1.0 .   # Kopf operator, no torch
#   docker build --target trainer  -t ghcr.io/ddpjob/trainer:0.1.0 .    # CUDA build of torch, for NCCL
# Both run as the non-root user 10001, the UID the chart's securityContext names.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 ddpjob \
    && useradd --system --uid 10001 --gid ddpjob --home-dir /home/ddpjob --create-home --shell /usr/sbin/nologin ddpjob

# The sources every image is built from; the box (test tooling) is copied only because pyproject.toml
# lists its package, and is deleted from the installed environment below.
FROM base AS source
WORKDIR /src
COPY pyproject.toml ./
COPY contract/ddpjob_contract contract/ddpjob_contract
COPY operator/ddpjob_operator operator/ddpjob_operator
COPY trainer/ddp_trainer trainer/ddp_trainer
COPY box/ddpjob_box box/ddpjob_box

FROM source AS build-operator
RUN python -m venv /opt/ddpjob \
    && /opt/ddpjob/bin/pip install --no-cache-dir ".[operator]" \
    && rm -rf /opt/ddpjob/lib/python3*/site-packages/ddpjob_box

FROM source AS build-trainer
# On Linux x86_64, PyPI's torch wheel is the CUDA build; the NVIDIA libraries (NCCL among them) come as wheels.
RUN python -m venv /opt/ddpjob \
    && /opt/ddpjob/bin/pip install --no-cache-dir ".[trainer]" \
    && rm -rf /opt/ddpjob/lib/python3*/site-packages/ddpjob_box

FROM base AS operator
COPY --from=build-operator /opt/ddpjob /opt/ddpjob
ENV PATH=/opt/ddpjob/bin:$PATH
USER 10001:10001
# --metrics-port and Kopf's /healthz (--liveness)
EXPOSE 8080 8081
ENTRYPOINT ["ddpjob", "operator"]

FROM base AS trainer
COPY --from=build-trainer /opt/ddpjob /opt/ddpjob
ENV PATH=/opt/ddpjob/bin:$PATH
WORKDIR /home/ddpjob
USER 10001:10001
# MASTER_PORT (29500) and the trainer's /metrics (METRICS_PORT, 9090): the CRD's defaults
EXPOSE 29500 9090
ENTRYPOINT ["python", "-m", "ddp_trainer"]
