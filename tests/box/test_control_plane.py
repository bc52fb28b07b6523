"""The control plane is real: CRDs, garbage collection, RBAC and scheduling come from Kubernetes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ddpjob_box import audit
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster

GROUP = "smoke.ddpjob.dev"


# The garbage collector rediscovers API types every 30 s, so it may not know a brand-new CRD sooner.
GC_DISCOVERY_SECONDS = 30


@dataclass(frozen=True)
class Widgets:
    plural: str
    kind: str
    established_at: float


def _crd(plural: str, kind: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def widgets(api_client: Any) -> Iterator[Widgets]:
    suffix = uuid.uuid4().hex[:4]
    plural, kind = f"widgets{suffix}", f"Widget{suffix}"
    ext = client.ApiextensionsV1Api(api_client)
    ext.create_custom_resource_definition(_crd(plural, kind))

    def established() -> bool:
        crd = ext.read_custom_resource_definition(f"{plural}.{GROUP}")
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    _wait(established, 30, "the CRD to be established")
    yield Widgets(plural, kind, time.monotonic())
    ext.delete_custom_resource_definition(f"{plural}.{GROUP}")


def test_a_registered_crd_accepts_a_custom_object(api_client: Any, namespace: str, widgets: Widgets) -> None:
    custom = client.CustomObjectsApi(api_client)
    body = {"apiVersion": f"{GROUP}/v1", "kind": widgets.kind, "metadata": {"name": "w1"}, "spec": {"size": 3}}
    custom.create_namespaced_custom_object(GROUP, "v1", namespace, widgets.plural, body)
    got = custom.get_namespaced_custom_object(GROUP, "v1", namespace, widgets.plural, "w1")
    assert got["spec"] == {"size": 3}


def test_the_garbage_collector_deletes_a_child_within_30s_of_its_owner(
    api_client: Any, namespace: str, widgets: Widgets
) -> None:
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    body = {"apiVersion": f"{GROUP}/v1", "kind": widgets.kind, "metadata": {"name": "owner"}}
    owner = custom.create_namespaced_custom_object(GROUP, "v1", namespace, widgets.plural, body)
    reference = {"apiVersion": f"{GROUP}/v1", "kind": widgets.kind, "name": "owner", "uid": owner["metadata"]["uid"]}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "child", "ownerReferences": [reference]}})
    time.sleep(max(0.0, widgets.established_at + GC_DISCOVERY_SECONDS + 2 - time.monotonic()))
    custom.delete_namespaced_custom_object(GROUP, "v1", namespace, widgets.plural, "owner")

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", namespace)
        except ApiException as err:
            return bool(err.status == 404)
        return False

    _wait(child_gone, 30, "the garbage collector to delete the child")


def test_a_service_account_with_no_role_is_forbidden_to_list_pods(
    api_client: Any, cluster: Cluster, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    config = client.Configuration()
    config.host = api_client.configuration.host
    config.ssl_ca_cert = api_client.configuration.ssl_ca_cert
    config.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(config) as as_nobody, pytest.raises(ApiException) as refused:
        client.CoreV1Api(as_nobody).list_namespaced_pod(namespace)
    assert refused.value.status == 403
    assert f"system:serviceaccount:{namespace}:nobody" in str(refused.value.body)


def test_the_scheduler_sees_a_pod_without_a_node(api_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "lonely"},
            "spec": {
                "containers": [{"name": "main", "image": "ddpjob/nothing:never"}],
                "nodeSelector": {"ddpjob.dev/no-such-node": "true"},
            },
        },
    )

    def scheduler_decided() -> bool:
        conditions = core.read_namespaced_pod("lonely", namespace).status.conditions or []
        return any(c.type == "PodScheduled" for c in conditions)

    _wait(scheduler_decided, 30, "kube-scheduler to set PodScheduled")
    condition = next(
        c for c in core.read_namespaced_pod("lonely", namespace).status.conditions if c.type == "PodScheduled"
    )
    assert condition.status == "False"
    assert condition.reason == "Unschedulable"


def test_the_audit_log_names_who_deleted_each_pod(api_client: Any, cluster: Cluster, namespace: str) -> None:
    """A pod that vanishes is explained: a test's delete and the garbage collector's each appear, by user."""
    assert cluster.box is not None and cluster.box.plane is not None
    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    for name, refs in (("victim-mine", []), ("victim-owned", [ref])):
        spec = {
            "containers": [{"name": "main", "image": "ddpjob/nothing:never"}],
            "nodeSelector": {"ddpjob.dev/no-such-node": "true"},  # never bound, so a delete is immediate
        }
        core.create_namespaced_pod(namespace, {"metadata": {"name": name, "ownerReferences": refs}, "spec": spec})
    core.delete_namespaced_pod("victim-mine", namespace)
    core.delete_namespaced_config_map("owner", namespace)
    log = cluster.box.plane.audit_log

    def both_seen() -> bool:
        said = audit.removals(log, namespace, "victim")
        return any(" pods/victim-mine: " in line for line in said) and any(
            " pods/victim-owned: " in line for line in said
        )

    _wait(both_seen, GC_DISCOVERY_SECONDS + 30, f"both deletions in {log}")
    said = audit.removals(log, namespace, "victim")
    assert any(line.endswith("box-admin delete pods/victim-mine: 200") for line in said), said
    gc = "system:serviceaccount:kube-system:generic-garbage-collector delete pods/victim-owned: 200"
    assert any(line.endswith(gc) for line in said), said
