# Two entry points: `make test` and `make demo`. Both set up everything on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Caches live outside the repository, keyed by version: pip downloads, Go binaries (see box/ddpjob_box/toolchain.py).
export DDPJOB_CACHE ?= $(HOME)/.cache/ddpjob
export PIP_CACHE_DIR ?= $(DDPJOB_CACHE)/pip
# The venv is installed by uv, which links the packages from its cache (same filesystem) instead of unpacking them:
# a fresh clone's venv takes about 25 s where pip took 1.5 minutes (torch's CUDA wheels are 5 GB unpacked). It compiles
# the bytecode as pip does: without it, every process paid about 1.2 s more to import torch (2.9 s, not 1.7 s).
UV_VERSION := 0.13.9
export UV_CACHE_DIR ?= $(DDPJOB_CACHE)/uv
PYTEST_ARGS ?=
# Three workers: each box group on one, with a box of its own, and the tests that need no box (tests/workers.py).
PYTEST_WORKERS ?= -n 3
# The Go toolchain's usual home, for shells that do not have it on PATH.
export PATH := $(PATH):/usr/local/go/bin

.PHONY: setup venv tools system-packages images test lint demo bench soak clean-venv

# setup, test and demo run their steps side by side where they can (box/ddpjob_box/prepare.py): the Go builds
# while the venv and the images download, each with a progress line and a table of step times at the end.
# It runs on the system's python3, with the standard library alone, as the venv is one of its steps.
PREPARE := PYTHONPATH=box $(PYTHON) -m ddpjob_box.prepare

# venv, Debian packages, every Go build and the images: what make test and make demo need
setup:
	$(PREPARE) setup

# The extras the venv holds: everything by default; make demo asks for the operator's alone (the box needs no torch
# and no test tools on the host), which saves a cold machine torch's download, unpacking and bytecode: 13 CPU-s
# against 56. Each set has its own stamp, so a later make test adds the rest.
VENV_EXTRAS ?= operator,trainer,dev
venv: $(VENV)/.installed-$(VENV_EXTRAS)
$(VENV)/.installed-%: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[$*]'
	@touch $@

# Debian packages the box needs: iproute2, openssl, containerd, runc and the CNI plugins for the node, buildah,
# debootstrap, umoci and skopeo (the export into the OCI layout, layers uncompressed) for the images (no crun: it
# fails on hybrid cgroups).
system-packages:
	@missing=""; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v unshare >/dev/null || missing="$$missing util-linux"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v containerd >/dev/null || missing="$$missing containerd"; \
	test -x /usr/sbin/runc || missing="$$missing runc"; \
	command -v buildah >/dev/null || missing="$$missing buildah"; \
	test -x /usr/sbin/debootstrap || missing="$$missing debootstrap"; \
	test -x /usr/lib/cni/bridge || missing="$$missing containernetworking-plugins"; \
	command -v umoci >/dev/null || missing="$$missing umoci"; \
	command -v skopeo >/dev/null || missing="$$missing skopeo"; \
	command -v iptables >/dev/null || test -x /usr/sbin/iptables || missing="$$missing iptables"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends $$missing >/dev/null; \
	fi

tools:
	$(PREPARE) tools

# The base, pause, operator and trainer images, built with buildah and cached by their inputs (see
# box/ddpjob_box/images.py); CONTAINERD_SOCKET=/path/to.sock also imports them into that containerd, whose root
# directory is CONTAINERD_ROOT (its layers are linked there).
CONTAINERD_SOCKET ?=
CONTAINERD_ROOT ?= /var/lib/containerd
images: venv system-packages
	$(PY) -m ddpjob_box.images $(if $(CONTAINERD_SOCKET),--containerd-socket $(CONTAINERD_SOCKET) --containerd-root $(CONTAINERD_ROOT))

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The images are built (or found in the cache) before any test runs: a cold build takes several minutes,
# which no test's own time limit should include. The lint runs beside the Go builds.
test:
	$(PREPARE) test -- $(PY) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

demo:
	$(PREPARE) demo -- $(PY) -m ddpjob_box.demo

bench: setup
	$(PY) -m bench.run_all

# 200 seeded chaos runs against the box, 4 at a time (bench/chaos/; make test runs 4 of them), and 100 SIGKILLs of the
# trainer inside its checkpoint writes (bench/checkpoint_kills.py; make test runs 2)
soak: setup
	$(PY) -m bench.checkpoint_kills --kills 100
	$(PY) -m bench.chaos --runs 200 --seed 1 --parallel 4

clean-venv:
	rm -rf $(VENV)
