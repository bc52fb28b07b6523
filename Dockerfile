# syntax=docker/dockerfile:1
# Two images from one file, each installing the pinned dependencies of its pyproject.toml extra
# (the same pins make and CI install):
#   docker build --target operator -t ghcr.io/ddpjob/operator:0.1.0 .   # Kopf operator, no torch
#   docker build --target trainer  -t ghcr.io/ddpjob/trainer:0.1.0 .    # CUDA build of torch, for NCCL
# Both run as the non-root user 10001, the UID the chart's securityContext names.
# `make images` builds them with buildah from a local Debian base (PYTHON_IMAGE), with the host's pip cache
# mounted on the cache mounts below, and imports them into the box's containerd.
#
# pip's HTTP cache keeps nothing behind a proxy that marks responses uncacheable, so the dependency stages
# keep the wheels themselves in a wheelhouse on the cache mount: a rebuild downloads only what changed.
#
# Layers, cheapest change last: the base, the dependencies (they change only with pyproject.toml's pins),
# then the project's own packages (a source change rebuilds only these).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 ddpjob \
    && useradd --system --uid 10001 --gid ddpjob --home-dir /home/ddpjob --create-home --shell /usr/sbin/nologin ddpjob

# One requirements file per extra, from pyproject.toml alone: a change elsewhere in it (the version, the tools'
# settings) writes the same files, with a fixed mtime (buildah's COPY cache digests it), so the dependency
# layers below stay cached.
FROM base AS requirements
WORKDIR /requirements
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb')); d = p['project']; \
[open(e + '.txt', 'w').write('\n'.join(p['build-system']['requires'] + d['dependencies'] + d['optional-dependencies'][e]) + '\n') \
 for e in ('operator', 'trainer')]" \
    && touch -d @0 operator.txt trainer.txt

FROM base AS deps-operator
COPY --from=requirements /requirements/operator.txt /tmp/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m venv /opt/ddpjob \
    && /opt/ddpjob/bin/pip download --dest /root/.cache/pip/wheelhouse -r /tmp/requirements.txt \
    && /opt/ddpjob/bin/pip install --no-index --find-links /root/.cache/pip/wheelhouse -r /tmp/requirements.txt \
    && /opt/ddpjob/bin/python -c "import site; open(site.getsitepackages()[0] + '/ddpjob-app.pth', 'w').write('/opt/ddpjob/app\n')"

FROM base AS deps-trainer
COPY --from=requirements /requirements/trainer.txt /tmp/requirements.txt
# On Linux x86_64, PyPI's torch wheel is the CUDA build; the NVIDIA libraries (NCCL among them) come as wheels.
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m venv /opt/ddpjob \
    && /opt/ddpjob/bin/pip download --dest /root/.cache/pip/wheelhouse -r /tmp/requirements.txt \
    && /opt/ddpjob/bin/pip install --no-index --find-links /root/.cache/pip/wheelhouse -r /tmp/requirements.txt \
    && /opt/ddpjob/bin/python -c "import site; open(site.getsitepackages()[0] + '/ddpjob-app.pth', 'w').write('/opt/ddpjob/app\n')"

# The sources every image is built from; the box (test tooling) is copied only because pyproject.toml
# lists its package, and no image keeps it.
FROM base AS source
WORKDIR /src
COPY pyproject.toml ./
COPY cli/ddpjob_cli cli/ddpjob_cli
COPY contract/ddpjob_contract contract/ddpjob_contract
COPY operator/ddpjob_operator operator/ddpjob_operator
COPY trainer/ddp_trainer trainer/ddp_trainer
COPY box/ddpjob_box box/ddpjob_box

# The project's packages alone, into /opt/ddpjob/app (its own layer; the venv finds it through a .pth file).
FROM deps-operator AS build-operator
COPY --from=source /src /src
RUN /opt/ddpjob/bin/pip install --no-deps --no-build-isolation --target /opt/ddpjob/app /src \
    && rm -rf /opt/ddpjob/app/ddpjob_box

FROM deps-trainer AS build-trainer
COPY --from=source /src /src
RUN /opt/ddpjob/bin/pip install --no-deps --no-build-isolation --target /opt/ddpjob/app /src \
    && rm -rf /opt/ddpjob/app/ddpjob_box /opt/ddpjob/app/ddpjob_cli /opt/ddpjob/app/ddpjob_operator /opt/ddpjob/app/bin

FROM deps-operator AS operator
COPY --from=build-operator /opt/ddpjob/app /opt/ddpjob/app
ENV PATH=/opt/ddpjob/app/bin:/opt/ddpjob/bin:$PATH
USER 10001:10001
# --metrics-port and Kopf's /healthz (--liveness)
EXPOSE 8080 8081
ENTRYPOINT ["ddpjob", "operator"]

FROM deps-trainer AS trainer
COPY --from=build-trainer /opt/ddpjob/app /opt/ddpjob/app
ENV PATH=/opt/ddpjob/bin:$PATH
WORKDIR /home/ddpjob
USER 10001:10001
# MASTER_PORT (29500) and the trainer's /metrics (METRICS_PORT, 9090): the CRD's defaults
EXPOSE 29500 9090
ENTRYPOINT ["python", "-m", "ddp_trainer"]
