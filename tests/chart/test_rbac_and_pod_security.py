"""The chart's RBAC and pods against the real apiserver: `kubectl auth can-i` as the operator's
ServiceAccount, and Pod Security admission in a namespace that enforces `restricted`."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from ddpjob_operator import api, builders
from tests.chart.helm import CHART, REPO, helm, kubectl, one, template
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


@pytest.fixture(autouse=True)
def _served(crd: str) -> None:
    """`kubectl auth can-i` resolves ddpjobs.ddpjob.dev only while the CRD is served."""


@contextmanager
def _rbac(cluster: Cluster, tmp_path: Path, release: str, namespace: str, *sets: str) -> Iterator[None]:
    """The chart's ServiceAccount and RBAC, applied exactly as rendered, and deleted after: its cluster-scoped objects
    (the node reader) outlive the test's namespace."""
    shown = ["--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"]
    text = helm("template", release, str(CHART), "--namespace", namespace, *shown, *sets).stdout
    path = tmp_path / f"{release}-rbac.yaml"
    path.write_text(text)
    try:
        kubectl(cluster.kubeconfig, "apply", "-f", str(path))
        yield
    finally:
        kubectl(cluster.kubeconfig, "delete", "--ignore-not-found", "-f", str(path), check=False)


def _can(cluster: Cluster, account: str, verb: str, resource: str, *where: str) -> bool:
    proc = kubectl(cluster.kubeconfig, "auth", "can-i", verb, resource, "--as", account, *where, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stderr
    return answer == "yes"


# (verb, resource, extra args): what the operator does, in its namespace.
OPERATOR_NEEDS = [
    ("get", "ddpjobs.ddpjob.dev", ()),
    ("list", "ddpjobs.ddpjob.dev", ()),
    ("watch", "ddpjobs.ddpjob.dev", ()),
    ("delete", "ddpjobs.ddpjob.dev", ()),
    ("update", "ddpjobs.ddpjob.dev", ("--subresource=status",)),
    ("update", "ddpjobs.ddpjob.dev", ("--subresource=finalizers",)),
    ("list", "pods", ()),
    ("watch", "pods", ()),
    ("create", "pods", ()),
    ("delete", "pods", ()),
    ("create", "services", ()),
    ("create", "events", ()),
]
# What it must never do, even in its own namespace.
NEVER = [
    ("get", "secrets", ()),
    ("list", "secrets", ()),
    ("get", "configmaps", ()),
    ("update", "pods", ()),
    ("create", "pods", ("--subresource=exec",)),
    ("update", "ddpjobs.ddpjob.dev", ()),
    ("delete", "services", ()),
    ("create", "deployments.apps", ()),
    ("create", "rolebindings.rbac.authorization.k8s.io", ()),
    ("create", "serviceaccounts", ("--subresource=token",)),
]


@pytest.fixture
def other_namespace(api_client: Any) -> Iterator[str]:
    core = client.CoreV1Api(api_client)
    name = f"other-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"ddpjob.dev/test": "true"}}})
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


def test_in_namespaced_mode_the_operator_can_do_its_job_in_its_namespace_and_nothing_outside_it(
    cluster: Cluster, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    with _rbac(cluster, tmp_path, "ddpjob", namespace):
        _least_privilege(cluster, namespace, other_namespace)


def _least_privilege(cluster: Cluster, namespace: str, other_namespace: str) -> None:
    sa = f"system:serviceaccount:{namespace}:ddpjob"
    missing = [(v, r, *x) for v, r, x in OPERATOR_NEEDS if not _can(cluster, sa, v, r, "-n", namespace, *x)]
    assert missing == [], "the chart's Role lacks what the operator does"
    allowed = [(v, r, *x) for v, r, x in NEVER if _can(cluster, sa, v, r, "-n", namespace, *x)]
    assert allowed == [], "more than least privilege"
    for verb, resource, extra in OPERATOR_NEEDS:
        assert not _can(cluster, sa, verb, resource, "-n", other_namespace, *extra), f"{verb} {resource} elsewhere"
    assert not _can(cluster, sa, "list", "pods", "--all-namespaces")
    assert not _can(cluster, sa, "list", "ddpjobs.ddpjob.dev", "--all-namespaces")
    assert not _can(cluster, sa, "list", "namespaces")
    assert not _can(cluster, sa, "list", "customresourcedefinitions.apiextensions.k8s.io")
    assert _can(cluster, sa, "get", f"namespaces/{namespace}", "-n", namespace), "is its namespace being deleted?"
    assert not _can(cluster, sa, "get", f"namespaces/{other_namespace}", "-n", other_namespace)


def test_watched_namespaces_get_the_operator_permissions_there_and_only_there(
    cluster: Cluster, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    """The operator lives in `namespace` and watches only `other_namespace`."""
    with _rbac(cluster, tmp_path, "ddpjob", namespace, "--set", f"watch.namespaces={{{other_namespace}}}"):
        sa = f"system:serviceaccount:{namespace}:ddpjob"
        assert _can(cluster, sa, "create", "pods", "-n", other_namespace)
        assert _can(cluster, sa, "update", "ddpjobs.ddpjob.dev", "-n", other_namespace, "--subresource=status")
        assert not _can(cluster, sa, "create", "pods", "-n", namespace)
        assert not _can(cluster, sa, "get", "secrets", "-n", other_namespace)


def test_in_cluster_wide_mode_the_operator_reaches_every_namespace_but_still_no_secrets(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    release = f"cw-{namespace}"  # cluster-scoped names must not collide between tests
    with _rbac(cluster, tmp_path, release, namespace, "--set", "watch.clusterWide=true"):
        sa = f"system:serviceaccount:{namespace}:{release}-ddpjob"
        for verb, resource, extra in OPERATOR_NEEDS:
            assert _can(cluster, sa, verb, resource, "-n", "default", *extra), f"{verb} {resource}"
        assert _can(cluster, sa, "watch", "pods", "--all-namespaces")
        assert _can(cluster, sa, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        for verb, resource, extra in NEVER:
            assert not _can(cluster, sa, verb, resource, "--all-namespaces", *extra), f"{verb} {resource}"
        assert not _can(cluster, sa, "list", "namespaces")
        assert not _can(cluster, sa, "delete", "customresourcedefinitions.apiextensions.k8s.io")


def _restricted(cluster: Cluster, namespace: str) -> None:
    kubectl(cluster.kubeconfig, "label", "namespace", namespace, *(f"{k}={v}" for k, v in RESTRICTED.items()))


def _refusal(cluster: Cluster, namespace: str, pod: dict[str, Any], tmp_path: Path) -> str:
    """Create the pod with a server-side dry run: '' when admitted, else the apiserver's refusal."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod))
    proc = kubectl(cluster.kubeconfig, "create", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
    return "" if proc.returncode == 0 else proc.stderr.strip()


def test_a_restricted_namespace_admits_the_operator_pod_and_refuses_a_privileged_one(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    _restricted(cluster, namespace)
    docs = template(namespace=namespace)
    account = tmp_path / "serviceaccount.json"
    account.write_text(json.dumps(one(docs, "ServiceAccount")))
    kubectl(cluster.kubeconfig, "apply", "-f", str(account))
    template_ = one(docs, "Deployment")["spec"]["template"]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "operator", **template_["metadata"]},
        "spec": copy.deepcopy(template_["spec"]),
    }
    assert _refusal(cluster, namespace, pod, tmp_path) == ""
    privileged = copy.deepcopy(pod)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert "violates PodSecurity" in _refusal(cluster, namespace, privileged, tmp_path)


@pytest.mark.parametrize("example", ["cpu-ddp.yaml", "resnet50-ddp.yaml"])
def test_a_restricted_namespace_admits_every_pod_the_operator_builds_from_the_examples(
    cluster: Cluster, namespace: str, example: str, tmp_path: Path
) -> None:
    _restricted(cluster, namespace)
    docs = yaml.safe_load_all((REPO / "manifests" / example).read_text())
    body = next(d for d in docs if d and d["kind"] == "DDPJob")
    body["metadata"] |= {"namespace": namespace, "uid": "00000000-0000-0000-0000-000000000000"}
    pod = builders.pod(api.parse_job(body), 0, 0, gang=False)
    assert pod["spec"].get("initContainers"), "the wait-for-master init container is checked too"
    assert _refusal(cluster, namespace, pod, tmp_path) == ""
