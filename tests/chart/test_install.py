"""helm install into the box, in a namespace that enforces Pod Security `restricted`: the operator runs
from the image built from the Dockerfile, as a pod under the chart's ServiceAccount (UID 10001, read-only
root, kubelet probing its /healthz), reconciles the CPU example to Succeeded with both ranks from the
trainer image, every dashboard panel's PromQL returns data from the box's Prometheus while it trains,
and helm uninstall leaves only the CRD (and the jobs it holds)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ddpjob_box import images
from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.prometheus import Prometheus
from tests.chart.helm import CHART, DASHBOARD, REPO, helm, label_selector, one, template
from tests.conftest import Cluster
from tests.e2e.conftest import Kubectl
from tests.e2e.kube import wait_for

pytestmark = pytest.mark.e2e

RELEASE = "ddpjob"
CRD = "ddpjobs.ddpjob.dev"
GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
STEPS = 400
# Grafana's variables, as a user would pick them; 1m spans many 2 s scrapes of the box's Prometheus.
RATE_INTERVAL, RANGE = "1m", "15m"
# An API refusal as the operator's log shows it: the apiserver's reason and message, or the client's
# "(403)". Not a bare 403: every line's millisecond stamp ("20:19:36,403]") matches it 1 time in 1000.
REFUSED = re.compile(r"Forbidden|is forbidden:|\(403\)")


@dataclass
class Release:
    namespace: str
    kubeconfig: Path
    crd_existed: bool
    core: Any
    custom: Any
    apps: Any
    notes: str = ""  # what helm install printed
    seen: dict[str, Any] = field(default_factory=dict)  # what the training run observed, for the tests

    def helm(self, *args: str, check: bool = True) -> Any:
        return helm(*args, "--namespace", self.namespace, kubeconfig=self.kubeconfig, check=check)

    def operator_pods(self) -> list[Any]:
        """The operator's running replicas."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"app.kubernetes.io/instance={RELEASE}")
        return [p for p in pods.items if p.status.phase == "Running" and not p.metadata.deletion_timestamp]

    def operator_pod(self) -> Any:
        running = self.operator_pods()
        return running[0] if running else None

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name))


@pytest.fixture(scope="module")
def release(cluster: Cluster, api_client: Any, node: KubeletNode) -> Iterator[Release]:
    """The chart installed with its defaults (plus the dashboard ConfigMap) into a fresh restricted namespace."""
    core = client.CoreV1Api(api_client)
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.read_custom_resource_definition(CRD)
        crd_existed = True
    except ApiException as err:
        assert err.status == 404
        crd_existed = False
    namespace = f"chart-{uuid.uuid4().hex[:8]}"
    labels = {"ddpjob.dev/test": "true", "pod-security.kubernetes.io/enforce": "restricted"}
    core.create_namespace({"metadata": {"name": namespace, "labels": labels}})
    installed = Release(
        namespace=namespace,
        kubeconfig=cluster.kubeconfig,
        crd_existed=crd_existed,
        core=core,
        custom=client.CustomObjectsApi(api_client),
        apps=client.AppsV1Api(api_client),
    )
    try:
        installed.notes = installed.helm(
            "install", RELEASE, str(CHART), "--set", "dashboard.enabled=true", "--wait", "--timeout=5m"
        ).stdout
        yield installed
    finally:
        installed.helm("uninstall", RELEASE, "--wait", "--timeout=2m", check=False)
        core.delete_namespace(namespace, propagation_policy="Background")


def _operator_log(release: Release) -> str:
    """Every running operator replica's log, the leader's and the standby's. Its Deployment replaces a pod that
    dies, so a pod listed may be gone by the time its log is read (404): then it has none to add."""
    logs = []
    for pod in release.operator_pods():
        try:
            logs.append(str(release.core.read_namespaced_pod_log(pod.metadata.name, release.namespace)))
        except ApiException as err:
            if err.status != 404:
                raise
    return "\n".join(logs)


def _diagnosis(release: Release) -> str:
    """What a failed wait shows: the jobs' status, the pods' phases and the operator's log tail."""
    jobs = release.custom.list_namespaced_custom_object(GROUP, VERSION, release.namespace, PLURAL)["items"]
    pods = release.core.list_namespaced_pod(release.namespace).items
    lines = [f"job {j['metadata']['name']}: {json.dumps(j.get('status'))}" for j in jobs]
    lines += [f"pod {p.metadata.name}: {p.status.phase}" for p in pods]
    log = _operator_log(release)
    return "\n".join([*lines, "operator log (tail):", *log.splitlines()[-40:]])


def _wait(release: Release, what: str, probe: Any, timeout: float) -> Any:
    try:
        return wait_for(what, probe, timeout, interval=1)
    except pytest.fail.Exception as failed:
        pytest.fail(f"{failed}\n{_diagnosis(release)}", pytrace=False)


def _substitute(expr: str, namespace: str, job: str) -> str:
    return (
        expr.replace("$namespace", namespace)
        .replace("$job", job)
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__range", RANGE)
    )


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


class LeaseHistory:
    """The leader Lease's holder, read every 0.1 s from a thread: who led when, while the operator rolls."""

    def __init__(self, release: Release) -> None:
        self._leases = client.CoordinationV1Api(release.core.api_client)
        self._namespace = release.namespace
        self.seen: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-history", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                holder = self._leases.read_namespaced_lease(RELEASE, self._namespace).spec.holder_identity or ""
            except ApiException:
                continue
            if not self.seen or self.seen[-1][1] != holder:
                self.seen.append((time.monotonic(), holder))

    def stop(self) -> list[tuple[float, str]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.seen


def _upgrade_while_training(release: Release, node: KubeletNode) -> dict[str, Any]:
    """`helm upgrade` to a new image tag (the same image, tagged anew in the node's containerd, as a registry
    would serve a new release) while the job trains: the Deployment rolls, the old leader hands the Lease over."""
    old = images.image_name("operator")
    tag = f"upgrade-{uuid.uuid4().hex[:6]}"
    new = f"{old.rsplit(':', 1)[0]}:{tag}"
    ctr = [shutil.which("ctr") or "ctr", "--address", str(node.layout.containerd_socket), "-n", "k8s.io", "images"]
    subprocess.run([*ctr, "tag", old, new], check=True, capture_output=True)
    before = sorted(p.metadata.name for p in release.operator_pods())
    history = LeaseHistory(release)
    try:
        release.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", f"image.tag={tag}", "--wait",
                     "--timeout=5m")  # fmt: skip

        def rolled() -> list[str] | None:  # helm waits for the new pods; the old ones go a moment later
            pods = release.operator_pods()
            new_only = len(pods) == 2 and all(c.image == new for p in pods for c in p.spec.containers)
            return sorted(p.metadata.name for p in pods) if new_only else None

        after: list[str] = wait_for("the rollout to end: two replicas, both of the new tag", rolled, 180, interval=1)

        def new_leader() -> bool:
            return bool(history.seen) and history.seen[-1][1] in after

        wait_for("a new replica to hold the Lease", new_leader, 60, interval=0.5)
    finally:
        seen = history.stop()
        subprocess.run([*ctr, "rm", new], check=False, capture_output=True)
    images_now = {c.image for p in release.operator_pods() for c in p.spec.containers}
    return {"before": before, "after": after, "lease": seen, "images": images_now, "image": new}


@pytest.fixture(scope="module")
def training(release: Release, prometheus: Prometheus, node: KubeletNode) -> Release:
    """Apply the CPU example (longer, and lingering), query every panel while it trains, wait for the end."""
    docs = [d for d in yaml.safe_load_all((REPO / "manifests" / "cpu-ddp.yaml").read_text()) if d]
    claim = one(docs, "PersistentVolumeClaim")
    job = dict(one(docs, "DDPJob"))
    name = job["metadata"]["name"]
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    args = list(trainer["args"])
    args[args.index("--steps") + 1] = str(STEPS)
    trainer["args"] = [*args, "--metrics-linger-seconds", "30"]
    release.core.create_namespaced_persistent_volume_claim(release.namespace, claim)
    release.custom.create_namespaced_custom_object(GROUP, VERSION, release.namespace, PLURAL, job)
    seen = release.seen
    seen["job"] = name

    def running() -> bool:
        phase = (release.job(name).get("status") or {}).get("phase")
        assert phase != "Failed", release.job(name)["status"]
        return phase == "Running"

    _wait(release, f"{name} to be Running", running, 240)
    policy = one(template(namespace=release.namespace), "NetworkPolicy")
    selected = release.core.list_namespaced_pod(
        release.namespace, label_selector=label_selector(policy["spec"]["podSelector"])
    )
    seen["policy_selects"] = sorted(p.metadata.name for p in selected.items)
    seen["pods"] = sorted(p.metadata.name for p in release.core.list_namespaced_pod(release.namespace).items)

    def halfway() -> bool:
        found = prometheus.query(f'ddp_steps_total{{namespace="{release.namespace}", ddpjob="{name}"}}')
        return len(found) == 2 and all(float(s["value"][1]) >= STEPS // 2 for s in found)

    _wait(release, "both ranks halfway, in Prometheus", halfway, 300)
    rolling = ThreadPoolExecutor(1, thread_name_prefix="upgrade")  # while the job trains, and the panels are read
    upgrade = rolling.submit(_upgrade_while_training, release, node)
    panels = [(p["title"], t["expr"]) for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    seen["panels"] = []
    deadline = time.monotonic() + 30  # a panel may need one more scrape; never more than the linger
    for title, expr in panels:
        query = _substitute(expr, release.namespace, name)
        result = prometheus.query(query)
        while not _finite(result) and time.monotonic() < deadline:
            time.sleep(1)
            result = prometheus.query(query)
        seen["panels"].append((title, query, result))

    def finished() -> str | None:
        phase = (release.job(name).get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    seen["upgrade"] = upgrade.result()
    rolling.shutdown()
    # Half the steps are left; a loaded 2-core CI machine has taken 0.43 s a step (a bound, not a timing).
    seen["phase"] = _wait(release, f"{name} to finish", finished, 600)
    seen["status"] = release.job(name)["status"]
    seen["operator_log"] = _operator_log(release)
    seen["images"] = {p.metadata.name: [c.image for c in p.spec.containers] for p in _pods(release, name)}
    return release


def test_helm_install_creates_the_crd_the_rbac_and_the_operator_deployment(release: Release) -> None:
    crd = client.ApiextensionsV1Api(release.core.api_client).read_custom_resource_definition(CRD)
    assert any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)
    if not release.crd_existed:
        assert "helm" in {f.manager for f in crd.metadata.managed_fields}, "helm created it from crds/"
    rbac = client.RbacAuthorizationV1Api(release.core.api_client)
    assert rbac.read_namespaced_role(RELEASE, release.namespace).rules
    binding = rbac.read_namespaced_role_binding(RELEASE, release.namespace)
    assert binding.subjects[0].name == RELEASE
    deployment = release.apps.read_namespaced_deployment(RELEASE, release.namespace)
    assert deployment.status.ready_replicas == 2, "two replicas, one of them the leader"
    assert f"rollout status deployment/{RELEASE}" in release.notes, "NOTES.txt tells how to check the operator"
    assert f"The operator watches: {release.namespace}" in release.notes


def _pods(release: Release, job: str) -> list[Any]:
    selector = f"ddpjob.dev/job-name={job}"
    return list(release.core.list_namespaced_pod(release.namespace, label_selector=selector).items)


def test_the_operator_runs_from_the_built_image_as_uid_10001_on_a_read_only_root_in_a_restricted_namespace(
    release: Release,
) -> None:
    kubectl = Kubectl(release.kubeconfig)
    pod = release.operator_pod()
    assert pod is not None, "the Deployment's pod runs on the box's node"
    namespace = release.core.read_namespace(release.namespace)
    assert namespace.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert pod.spec.service_account_name == RELEASE
    (container,) = pod.spec.containers
    assert container.image == images.image_name("operator") and container.args[0] == f"--namespace={release.namespace}"
    (status,) = pod.status.container_statuses
    assert status.image_id.startswith("sha256:"), "kubelet ran the image the box built and imported"
    ns, name = release.namespace, pod.metadata.name
    assert kubectl("exec", "-n", ns, name, "--", "id", "-u").stdout.split() == ["10001"]
    write = kubectl("exec", "-n", ns, name, "--", "touch", "/probe", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write.stderr

    def started() -> str | None:  # Running comes before the Python process has imported Kopf and logged
        log = kubectl("logs", "-n", ns, name).stdout
        return log if "ddpjob operator" in log.lower() or "kopf" in log.lower() else None

    wait_for("the operator's startup lines in kubectl logs", started, 60, interval=1)
    mounts = [m.mount_path for m in container.volume_mounts]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts


def test_the_operator_reconciles_the_cpu_example_to_succeeded_under_the_charts_rbac(training: Release) -> None:
    seen = training.seen
    forbidden = [line for line in seen["operator_log"].splitlines() if REFUSED.search(line)]
    assert forbidden == [], "the chart's RBAC lacks a permission the operator used"
    assert seen["phase"] == "Succeeded", seen["status"]
    assert seen["status"]["replicas"]["succeeded"] == 2, seen["status"]
    assert seen["status"].get("restarts", 0) == 0, seen["status"]
    trainer = images.image_name("trainer")
    assert seen["images"] == {f"{seen['job']}-{r}": [trainer] for r in (0, 1)}, "both ranks from the trainer image"


def test_every_dashboard_panel_returns_data_from_prometheus_while_the_job_trains(training: Release) -> None:
    empty = [(title, query) for title, query, result in training.seen["panels"] if not _finite(result)]
    assert empty == [], "panels without data"
    by_title = {title: result for title, _, result in training.seen["panels"]}
    assert sorted(s["metric"]["rank"] for s in by_title["Loss per rank"]) == ["0", "1"]
    phases = next(r for t, _, r in training.seen["panels"] if t == "Time per step by phase")
    assert sorted(s["metric"]["phase"] for s in phases) == ["backward", "data", "forward", "optimizer"]


def _metrics(release: Release, pod: str) -> str:
    """A replica's /metrics, read inside its pod (the operator image has Python, and no curl)."""
    url = "http://127.0.0.1:8080/metrics"  # the chart's operator.metricsPort
    fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    return Kubectl(release.kubeconfig)("exec", "-n", release.namespace, pod, "--", "python", "-c", fetch).stdout


def _sample(metrics: str, name: str, where: str = "") -> float:
    """The sum of a metric's samples whose labels contain ``where``."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(name) and where in line and not line.startswith("#"))  # fmt: skip


def _writes(metrics: str) -> list[str]:
    """A replica's write counters above 0, the election's own requests aside (both replicas may have raced to
    create the Lease: one got 409)."""
    return [line for line in metrics.splitlines() if line.startswith("ddpjob_operator_api_requests_total")
            and 'verb="GET"' not in line and 'resource="leases"' not in line
            and float(line.rsplit(" ", 1)[1]) > 0]  # fmt: skip


def test_of_the_two_replicas_exactly_one_holds_the_lease_and_the_standby_wrote_nothing(training: Release) -> None:
    assert training.seen["phase"] == "Succeeded"
    lease = client.CoordinationV1Api(training.core.api_client).read_namespaced_lease(RELEASE, training.namespace)
    pods = sorted(p.metadata.name for p in training.operator_pods())
    assert len(pods) == 2 and lease.spec.holder_identity in pods, (lease.spec, pods)
    (standby,) = [p for p in pods if p != lease.spec.holder_identity]
    leader = _metrics(training, lease.spec.holder_identity)
    quiet = _metrics(training, standby)
    assert _sample(leader, "ddpjob_operator_leader ") == 1 and _sample(quiet, "ddpjob_operator_leader ") == 0
    # (these are the replicas the upgrade made: the job may have ended before either led, so the leader may have had
    # nothing to write; the standby never may)
    assert _writes(quiet) == [], "the standby kept its watches and sent no write"


def test_a_helm_upgrade_to_a_new_image_while_the_job_trains_hands_the_lease_over_and_restarts_nothing(
    training: Release,
) -> None:
    upgrade = training.seen["upgrade"]
    assert upgrade["images"] == {upgrade["image"]}, "every replica runs the new tag"
    assert not set(upgrade["before"]) & set(upgrade["after"]), "both replicas were replaced"
    holders = [holder for _, holder in upgrade["lease"]]
    assert holders[0] in upgrade["before"] and holders[-1] in upgrade["after"], holders
    handovers = [i for i, h in enumerate(holders) if h == ""]
    assert handovers, f"the old leader released the Lease on SIGTERM (no wait for it to expire): {holders}"
    gaps = [upgrade["lease"][i + 1][0] - upgrade["lease"][i][0] for i in handovers if i + 1 < len(holders)]
    print(f"helm upgrade: holders {holders}; seconds with no leader at each handover: {[round(g, 1) for g in gaps]}")
    assert training.seen["phase"] == "Succeeded" and training.seen["status"].get("restarts", 0) == 0


def test_the_network_policy_selects_exactly_the_jobs_pods(training: Release) -> None:
    job = training.seen["job"]
    assert training.seen["policy_selects"] == [f"{job}-0", f"{job}-1"]
    assert any(name.startswith(RELEASE) for name in training.seen["pods"]), "the operator pod is left out"


def test_kubelets_liveness_probe_of_the_operator_passes(release: Release) -> None:
    # Placed after the training tests, whose run outlasts the probes' window: no sleeping here.
    pod = release.operator_pod()
    probe = pod.spec.containers[0].liveness_probe
    assert probe.http_get.path == "/healthz"
    assert pod.spec.containers[0].startup_probe.http_get.path == "/healthz"
    # Liveness runs from the first startup success (at the latest, when the pod turned Ready). Past its first probes:
    # kubelet would have restarted the container after failureThreshold misses.
    (ready,) = [c for c in pod.status.conditions if c.type == "Ready"]
    wait = (probe.initial_delay_seconds or 0) + probe.period_seconds * (probe.failure_threshold + 1)
    time.sleep(max(0, wait - (time.time() - ready.last_transition_time.timestamp())))
    pod = release.operator_pod()
    (status,) = pod.status.container_statuses
    assert status.ready and status.restart_count == 0, status
    events = release.core.list_namespaced_event(
        release.namespace, field_selector=f"involvedObject.name={pod.metadata.name}"
    )
    # readiness fails while the operator starts (its /healthz answers once it has): only liveness counts here
    assert [e.message for e in events.items if e.reason == "Unhealthy" and e.message.startswith("Liveness")] == []


def test_helm_uninstall_removes_everything_but_the_crd_and_the_jobs_it_holds(training: Release) -> None:
    release = training
    release.helm("uninstall", RELEASE, "--wait", "--timeout=2m")
    selector = f"app.kubernetes.io/instance={RELEASE}"
    ns = release.namespace
    rbac = client.RbacAuthorizationV1Api(release.core.api_client)
    networking = client.NetworkingV1Api(release.core.api_client)
    leftovers = {
        "deployments": release.apps.list_namespaced_deployment(ns, label_selector=selector).items,
        "serviceaccounts": release.core.list_namespaced_service_account(ns, label_selector=selector).items,
        "services": release.core.list_namespaced_service(ns, label_selector=selector).items,
        "configmaps": release.core.list_namespaced_config_map(ns, label_selector=selector).items,
        "roles": rbac.list_namespaced_role(ns, label_selector=selector).items,
        "rolebindings": rbac.list_namespaced_role_binding(ns, label_selector=selector).items,
        "networkpolicies": networking.list_namespaced_network_policy(ns, label_selector=selector).items,
    }
    assert {kind: [o.metadata.name for o in items] for kind, items in leftovers.items() if items} == {}
    wait_for("the operator pod to be gone", lambda: release.operator_pod() is None, 120, interval=1)
    client.ApiextensionsV1Api(release.core.api_client).read_custom_resource_definition(CRD)
    assert release.job(training.seen["job"])["status"]["phase"] == "Succeeded", "jobs outlive the chart"
