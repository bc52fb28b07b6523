"""Small helpers for end-to-end tests: waiting on pods and reading what the local node ran."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.3) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)
        time.sleep(interval)


def pod_phase(core: Any, name: str, namespace: str) -> str | None:
    try:
        return str(core.read_namespaced_pod(name, namespace).status.phase)
    except Exception:
        return None


def python_pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    """A pod of the project's trainer image running a Python snippet; ``spec`` merges into the pod spec."""
    container = {"name": "main", "image": "ghcr.io/ddpjob/trainer:dev", "command": ["python", "-c", code]}
    container.update(spec.pop("container", {}))
    return {
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }
