"""Cluster fixtures: the CRD from the chart, and the operator (Kopf, in a thread) per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ddpjob_box.operator_process import error_lines

from .helpers import Raw, apply_crd


@pytest.fixture(scope="session")
def raw(api_client: Any) -> Raw:
    return Raw(api_client)


@pytest.fixture(scope="session")
def crd(raw: Raw) -> dict[str, Any]:
    return apply_crd(raw)


@pytest.fixture(scope="session")
def kubeconfig(cluster: Any) -> Iterator[str]:
    """KUBECONFIG for the operator under test (Kopf and the kubernetes client both read it)."""
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    yield str(cluster.kubeconfig)
    if old is None:
        del os.environ["KUBECONFIG"]
    else:
        os.environ["KUBECONFIG"] = old


@pytest.fixture(autouse=True)
def _stop_fake_trainers(raw: Raw) -> Iterator[None]:
    yield
    raw.trainers.close()


@pytest.fixture(scope="module")
def module_namespace(raw: Raw) -> Iterator[str]:
    name = f"m-{uuid.uuid4().hex[:8]}"
    raw.post("/api/v1/namespaces", {"metadata": {"name": name, "labels": {"ddpjob.dev/test": "true"}}})
    try:
        yield name
    finally:
        raw.delete(f"/api/v1/namespaces/{name}", {"propagationPolicy": "Background"})


class Operator:
    """The operator under test, running in this process (Kopf's KopfRunner, in a thread), watching ``namespace``.

    As ``ddpjob operator -n <namespace>`` runs it: its handlers get the namespace in their memo (Kopf's own
    ``--namespace`` scopes only Kopf's watches, and the operator's are its own), set by a startup handler that
    runs before the operator's, in a registry of their own.
    """

    def __init__(self, namespace: str) -> None:
        import kopf
        from kopf.testing import KopfRunner

        from ddpjob_operator import handlers

        def scope(memo: kopf.Memo, **_: Any) -> None:
            memo["namespaces"] = [namespace]

        registry = kopf.OperatorRegistry()
        for handler in (scope, handlers.startup):
            kopf.on.startup(registry=registry)(handler)
        kopf.on.login(registry=registry)(handlers.login)
        kopf.on.cleanup(registry=registry)(handlers.cleanup)
        self.runner = KopfRunner(["run", "--standalone", "--namespace", namespace], registry=registry, timeout=60)

    def __enter__(self) -> Operator:
        self.runner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.runner.__exit__(*exc)

    def errors(self) -> list[str]:
        """Lines where the operator logged an error or a traceback (read after it stopped)."""
        return error_lines(self.runner.output)


@pytest.fixture
def operator(namespace: str, crd: dict[str, Any], kubeconfig: str) -> Iterator[Operator]:
    """The operator, watching this test's namespace; the test fails if it logged any error."""
    with Operator(namespace) as op:
        yield op
    assert op.errors() == [], "\n".join(op.errors())
