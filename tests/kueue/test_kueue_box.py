"""Kueue v0.17.0 in the box on Kubernetes 1.37, installed from its own chart as users install it.

Nothing Kueue owns is mocked: its manager runs on the box's kubelet node from an image built here, the
apiserver calls its webhooks through their Service, and a plain batch/v1 Job goes through Kueue's own
Job integration (suspended, a Workload, admitted, run) to completion.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box import images
from ddpjob_box.box import KUEUE_SLOTS, NODE_NAME, SLOT_RESOURCE, Box
from ddpjob_box.errors import BoxError
from ddpjob_box.kueue import DEPLOYMENT, EXTERNAL_FRAMEWORK, NAMESPACE, WAIT_FOR_PODS_READY, WEBHOOK_SERVICE
from tests.chart.helm import wait_established
from tests.e2e.conftest import CRD, Kubectl
from tests.e2e.jobs import cpu_job
from tests.e2e.kube import wait_for
from tests.kueue.conftest import CLUSTER_QUEUE, LOCAL_QUEUE, KueueCluster

pytestmark = [pytest.mark.cluster, pytest.mark.kubelet]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def get(kubectl: Kubectl, *args: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("get", *args, "-o", "json").stdout))


def create(
    kubectl: Kubectl, tmp_path: Path, body: dict[str, Any], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``kubectl create`` of ``body`` (printed back as JSON), through a file as a user would."""
    path = tmp_path / f"{body['metadata']['name']}.json"
    path.write_text(json.dumps(body))
    return kubectl("create", *args, "-o", "json", "-f", str(path), check=check)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def is_true(obj: dict[str, Any], type_: str) -> bool:
    found = condition(obj, type_)
    return bool(found and found["status"] == "True")


def test_kueue_runs_from_the_locally_built_image_on_the_boxs_node(kueue_cluster: KueueCluster) -> None:
    kubectl, image = kueue_cluster.kubectl, kueue_cluster.kueue.image
    deployment = get(kubectl, "deployment", DEPLOYMENT, "-n", NAMESPACE)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == (image, "Never")
    assert images.image_id(image), f"{image} is not in the box's buildah storage"

    pods = get(kubectl, "pods", "-n", NAMESPACE, "-l", "control-plane=controller-manager")["items"]
    assert len(pods) == 1
    pod = pods[0]
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert is_true(pod, "Ready")
    assert pod["status"]["containerStatuses"][0]["image"].endswith(image.split("/", 1)[1])


def test_the_node_advertises_more_slots_than_the_cluster_queue_grants(kueue_cluster: KueueCluster) -> None:
    node = get(kueue_cluster.kubectl, "node", NODE_NAME)
    assert node["status"]["allocatable"][SLOT_RESOURCE] == str(KUEUE_SLOTS)


def test_kueue_runs_with_ddpjob_as_an_external_framework_and_a_short_wait_for_pods_ready(
    kueue_cluster: KueueCluster,
) -> None:
    config = kueue_cluster.kueue.configuration()
    assert config["integrations"]["externalFrameworks"] == [EXTERNAL_FRAMEWORK]
    # The pod integration as the chart ships it, beside the built-in Job integration the next tests use.
    assert {"pod", "batch/job"} <= set(config["integrations"]["frameworks"])
    assert config["waitForPodsReady"] == WAIT_FOR_PODS_READY
    assert config["internalCertManagement"]["webhookServiceName"] == WEBHOOK_SERVICE


def test_the_apiserver_calls_kueues_webhooks_through_their_service(kueue_cluster: KueueCluster) -> None:
    kubectl = kueue_cluster.kubectl
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        config = get(kubectl, kind, f"kueue-{kind.removesuffix('webhookconfiguration')}-webhook-configuration")
        for webhook in config["webhooks"]:
            client = webhook["clientConfig"]
            assert "url" not in client, webhook["name"]
            assert client["service"]["name"] == WEBHOOK_SERVICE, webhook["name"]
            assert client["caBundle"], f"{webhook['name']} has no CA: Kueue's cert rotator did not inject it"
    crd = get(kubectl, "crd", "workloads.kueue.x-k8s.io")
    conversion = crd["spec"]["conversion"]
    assert conversion["strategy"] == "Webhook"
    assert conversion["webhook"]["clientConfig"]["service"]["name"] == WEBHOOK_SERVICE
    assert conversion["webhook"]["clientConfig"]["caBundle"]


def test_queues_are_accepted_and_an_invalid_cluster_queue_is_refused_by_kueues_webhook(
    kueue_cluster: KueueCluster, queues: str, tmp_path: Path
) -> None:
    kubectl = kueue_cluster.kubectl
    cluster_queue = get(kubectl, "clusterqueue", CLUSTER_QUEUE)
    covered = cluster_queue["spec"]["resourceGroups"][0]["coveredResources"]
    assert covered == ["cpu", "memory", SLOT_RESOURCE]
    assert is_true(get(kubectl, "localqueue", LOCAL_QUEUE, "-n", queues), "Active")

    # The CRD's schema and CEL rules let this through (as many flavor resources as covered ones); only
    # Kueue's validating webhook checks that their names match.
    invalid = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "invalid-queue"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": "default-flavor", "resources": [{"name": "memory", "nominalQuota": "1"}]}],
                }
            ],
        },
    }
    refused = create(kubectl, tmp_path, invalid, check=False)
    assert refused.returncode != 0
    assert 'admission webhook "vclusterqueue.kb.io" denied the request' in refused.stderr
    assert "must match the name in coveredResources" in refused.stderr


def batch_job(name: str) -> dict[str, Any]:
    """A Job that asks Kueue for one slot, created unsuspended: Kueue's webhook must suspend it."""
    request = {"cpu": "100m", "memory": "64Mi", SLOT_RESOURCE: "1"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: LOCAL_QUEUE}},
        "spec": {
            "suspend": False,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": images.ensure_base(quiet=True),
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "echo ran under Kueue"],
                            "resources": {"requests": request, "limits": request},
                        }
                    ],
                }
            },
        },
    }


def test_a_queued_batch_job_is_suspended_admitted_and_runs_to_completion_on_a_node(
    kueue_cluster: KueueCluster, queues: str, tmp_path: Path
) -> None:
    kubectl, ns = kueue_cluster.kubectl, queues
    created = json.loads(create(kubectl, tmp_path, batch_job("hello"), "-n", ns).stdout)
    assert created["spec"]["suspend"] is True, "Kueue's Job webhook did not suspend the queued Job"

    def workload() -> dict[str, Any] | None:
        found = get(kubectl, "workloads.kueue.x-k8s.io", "-n", ns)["items"]
        owned = [
            w for w in found if any(o["uid"] == created["metadata"]["uid"] for o in w["metadata"]["ownerReferences"])
        ]
        return owned[0] if owned else None

    first = wait_for("Kueue to make the Job's Workload", workload, 60)
    assert first["spec"]["queueName"] == LOCAL_QUEUE
    admitted = wait_for("the Workload to be admitted", lambda: (w := workload()) and is_true(w, "Admitted") and w, 60)
    assert admitted["status"]["admission"]["clusterQueue"] == CLUSTER_QUEUE
    flavors = admitted["status"]["admission"]["podSetAssignments"][0]["flavors"]
    assert flavors[SLOT_RESOURCE] == "default-flavor"

    job = wait_for(
        "the Job to complete",
        lambda: (j := get(kubectl, "job", "hello", "-n", ns)) and is_true(j, "Complete") and j,
        120,
    )
    assert job["spec"]["suspend"] is False
    pods = get(kubectl, "pods", "-n", ns, "-l", "job-name=hello")["items"]
    (placed,) = [p["spec"]["nodeName"] for p in pods]
    assert placed in {node.name for node in kueue_cluster.box.nodes}, "on one of the box's real nodes"
    assert "ran under Kueue" in kubectl("logs", "-n", ns, "job/hello").stdout
    wait_for("the Workload to be Finished", lambda: (w := workload()) and is_true(w, "Finished"), 60)


def test_kueue_stopped_refuses_queued_jobs_and_started_again_admits_them(
    kueue_cluster: KueueCluster, queues: str, tmp_path: Path
) -> None:
    kubectl, kueue, ns = kueue_cluster.kubectl, kueue_cluster.kueue, queues
    kueue.stop()
    try:
        assert not kueue.webhooks_answer()
        refused = create(kubectl, tmp_path, batch_job("while-down"), "-n", ns, check=False)
        assert refused.returncode != 0
        assert f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc" in refused.stderr, refused.stderr
    finally:
        kueue.start()
    create(kubectl, tmp_path, batch_job("after-restart"), "-n", ns)
    wait_for(
        "the Job made after Kueue's restart to complete",
        lambda: is_true(get(kubectl, "job", "after-restart", "-n", ns), "Complete"),
        180,
    )


def test_a_killed_kueue_comes_back_by_its_deployment(kueue_cluster: KueueCluster) -> None:
    kueue = kueue_cluster.kueue
    killed = kueue.kill()
    wait_for("a new Kueue pod", lambda: [p for p in kueue.pods() if p != killed], 60)
    kueue.wait_ready(180)
    assert killed not in kueue.pods()


def test_kueues_pod_webhook_leaves_a_pod_its_ddpjob_queues_to_the_operator_at_once(
    kueue_cluster: KueueCluster, queues: str, tmp_path: Path
) -> None:
    """The webhook reads the pod's DDPJob owner to decide: the box grants Kueue that read (without it, the
    webhook timed out on every such pod), and the external framework makes Kueue neither gate nor manage it."""
    kubectl, ns = kueue_cluster.kubectl, queues
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(kueue_cluster.kubeconfig, "ddpjobs.ddpjob.dev")
    job = cpu_job("owner")
    job["metadata"]["labels"] = {QUEUE_LABEL: LOCAL_QUEUE}
    owner = json.loads(create(kubectl, tmp_path, job, "-n", ns).stdout)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "owner-0",
            "labels": {QUEUE_LABEL: LOCAL_QUEUE},
            "ownerReferences": [
                {
                    "apiVersion": "ddpjob.dev/v1alpha1",
                    "kind": "DDPJob",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "main", "image": images.ensure_base(quiet=True)}]},
    }
    started = time.monotonic()
    # A server-side dry run passes the admission webhooks, and shows what they changed, without running a pod.
    created = json.loads(create(kubectl, tmp_path, pod, "-n", ns, "--dry-run=server").stdout)
    assert time.monotonic() - started < 5
    assert not created["spec"].get("schedulingGates"), "Kueue gated a pod its DDPJob owner queues"
    assert "kueue.x-k8s.io/managed" not in created["metadata"].get("labels", {})


def test_a_job_whose_pods_never_get_ready_is_evicted_for_pods_ready_timeout_and_requeued(
    kueue_cluster: KueueCluster, queues: str, tmp_path: Path
) -> None:
    """waitForPodsReady as the box configures it: evicted 60 s after admission, requeued after about 5 s."""
    kubectl, ns = kueue_cluster.kubectl, queues
    job = batch_job("never-ready")
    job["spec"]["template"]["spec"]["containers"][0]["image"] = "localhost/ddpjob/absent:none"
    uid = json.loads(create(kubectl, tmp_path, job, "-n", ns).stdout)["metadata"]["uid"]

    def workload() -> dict[str, Any]:
        found = get(kubectl, "workloads.kueue.x-k8s.io", "-n", ns)["items"]
        return next((w for w in found if w["metadata"]["ownerReferences"][0]["uid"] == uid), {})

    started = time.monotonic()
    wait_for("the Workload to be admitted", lambda: is_true(workload(), "Admitted"), 60)
    admitted = time.monotonic()
    evicted = wait_for(
        "the eviction", lambda: (c := condition(workload(), "Evicted")) and c["status"] == "True" and c, 120
    )
    assert evicted["reason"] == "PodsReadyTimeout", evicted
    evicted_after = time.monotonic() - admitted
    requeued = wait_for("the requeue", lambda: (w := workload()).get("status", {}).get("requeueState") and w, 60)
    assert requeued["status"]["requeueState"]["count"] >= 1
    # Kueue stops the Job and gives back its quota, then admits it again once the backoff has passed.
    wait_for("the Workload to give back its quota", lambda: not is_true(workload(), "QuotaReserved"), 60)
    evicted_at = time.monotonic()
    wait_for("the Workload to be admitted again", lambda: is_true(workload(), "Admitted"), 60)
    print(
        f"admitted {admitted - started:.0f}s after creation, evicted (PodsReadyTimeout) {evicted_after:.0f}s after"
        f" admission, admitted again {time.monotonic() - evicted_at:.0f}s after giving back its quota"
    )
    kubectl("delete", "job", "never-ready", "-n", ns)


def test_a_second_box_cannot_start_a_node_beside_this_one(kueue_cluster: KueueCluster) -> None:
    """Service rules are host-wide: a second box's kube-proxy sent this box's pods (Kueue's among them) to the
    other apiserver. The second box's node is refused at once, naming the first, and the first is unharmed."""
    # A short path, as the fixture's: kubelet's socket paths must fit in 107 bytes.
    with tempfile.TemporaryDirectory(prefix="ddpjob-box-") as tmp:
        second = Box(data_dir=Path(tmp) / "box", with_prometheus=False)
        with pytest.raises(BoxError, match="another box's node runs kube-proxy on this host") as refused:
            second.start()
    assert str(kueue_cluster.box.data_dir) in str(refused.value)
    assert kueue_cluster.kueue.webhooks_answer()
