"""The operator's check for in-place restarts, against the real apiserver and its admission: a server-side dry run
of a pod with a RestartAllContainers rule.

It must pass Pod Security ``restricted`` (the chart's namespaces enforce it: a probe without a securityContext was
refused there with 403, and the operator's reconciles failed on it), and a namespace whose admission refuses it
anyway costs the in-place restarts, never the job.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from ddpjob_operator.kube import Kube

pytestmark = pytest.mark.cluster


def _label(api_client: Any, namespace: str, labels: dict[str, str]) -> None:
    client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {"labels": labels}})


def test_the_probe_passes_pod_security_restricted_and_finds_the_feature_on_1_37(
    api_client: Any, namespace: str, kubeconfig: str
) -> None:
    _label(api_client, namespace, {"pod-security.kubernetes.io/enforce": "restricted"})
    kube = Kube()
    try:
        assert kube.restarts_in_place(namespace) is True
    finally:
        kube.close()
    assert not client.CoreV1Api(api_client).list_namespaced_pod(namespace).items, "a dry run creates nothing"


def test_a_namespace_whose_admission_refuses_the_probe_gets_no_in_place_restarts_and_no_error(
    api_client: Any, namespace: str, kubeconfig: str
) -> None:
    quota = {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    client.CoreV1Api(api_client).create_namespaced_resource_quota(namespace, quota)
    kube = Kube()
    try:
        assert kube.restarts_in_place(namespace) is False
    finally:
        kube.close()
