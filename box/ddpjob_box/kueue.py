"""Kueue in the box, installed as users install it: its own Helm chart, into ``kueue-system``.

The manager runs as the chart's Deployment on the box's node, from an image built locally
(``images.ensure_kueue``). The apiserver reaches its webhooks (mutating, validating and the CRDs'
conversion) through the Service ``kueue-webhook-service``, with the certificates Kueue makes and rotates
itself (internal cert management, as the chart ships it). Nothing Kueue owns is mocked or patched:
the box only chooses values for the chart. docs/box.md says why each one differs from the chart's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddpjob_box import toolchain
from ddpjob_box.errors import BoxError

NAMESPACE = "kueue-system"
RELEASE = "kueue"
# Names the chart gives its objects for the release "kueue" (its fullname is then "kueue").
DEPLOYMENT = "kueue-controller-manager"
SERVICE_ACCOUNT = "kueue-controller-manager"
CONFIG_MAP = "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"
WEBHOOK_SERVICE = "kueue-webhook-service"
VISIBILITY_API = "v1beta2.visibility.kueue.x-k8s.io"
POD_SELECTOR = "app.kubernetes.io/name=kueue,control-plane=controller-manager"
EXTERNAL_FRAMEWORK = "DDPJob.v1alpha1.ddpjob.dev"
"""DDPJob as Kueue's external framework: Kueue then leaves the pods a DDPJob owns to the operator."""

# waitForPodsReady, shortened for the box so a test sees an eviction and a requeue within about two minutes:
# an admitted workload not PodsReady after 60 s is evicted (PodsReadyTimeout), and requeued after about
# 5 s * 2^(n-1) (plus jitter), at most 60 s. Production defaults: timeout 5m, backoffBaseSeconds 60,
# backoffMaxSeconds 3600. recoveryTimeout is left to default to the timeout: a running gang that loses
# a pod has 60 s to be ready again. blockAdmission stays false, so jobs are admitted side by side.
WAIT_FOR_PODS_READY: dict[str, Any] = {
    "timeout": "60s",
    "blockAdmission": False,
    "requeuingStrategy": {
        "timestamp": "Eviction",
        "backoffBaseSeconds": 5,
        "backoffMaxSeconds": 60,
    },
}

# A precaution, not a failure seen: a 2-core box under training load may answer a probe in over a second (the
# chart's timeout), and three missed liveness probes restart the manager.
PROBE_TIMEOUT_S = 5


def chart_dir() -> Path:
    return toolchain.kueue_module_dir() / "charts" / "kueue"


def manager_config(shipped: str, pods_ready_timeout: str = "") -> dict[str, Any]:
    """Kueue's Configuration: the chart's own (its frameworks list, the pod integration among them, as it
    ships), plus DDPJob as an external framework and waitForPodsReady (its timeout ``pods_ready_timeout`` when
    given: ``bench.scale`` takes Kueue's own 5m)."""
    config: dict[str, Any] = yaml.safe_load(shipped)
    config.setdefault("integrations", {})["externalFrameworks"] = [EXTERNAL_FRAMEWORK]
    config["waitForPodsReady"] = {
        **WAIT_FOR_PODS_READY,
        **({"timeout": pods_ready_timeout} if pods_ready_timeout else {}),
    }
    return config


def chart_values(image: str, shipped_config: str, node: str, pods_ready_timeout: str = "") -> dict[str, Any]:
    """The values the box installs the chart with, its manager on ``node``; everything else is the chart's
    default."""
    repository, tag = image.rsplit(":", 1)
    probe = {"timeoutSeconds": PROBE_TIMEOUT_S}
    return {
        "controllerManager": {
            "manager": {
                # Built here, imported into the node's containerd: there is no registry to pull from.
                "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                # The chart asks for half a core; the box has two, and its jobs need them.
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"cpu": "1", "memory": "512Mi"},
                },
            },
            "readinessProbe": dict(probe),
            "livenessProbe": dict(probe),
            # On the box's first node: tests cut the others' power, which would take Kueue down with them
            "nodeSelector": {"kubernetes.io/hostname": node},
        },
        "managerConfig": {
            "controllerManagerConfigYaml": yaml.safe_dump(manager_config(shipped_config, pods_ready_timeout))
        },
    }


def shipped_manager_config(chart: Path) -> str:
    values = yaml.safe_load((chart / "values.yaml").read_text())
    return str(values["managerConfig"]["controllerManagerConfigYaml"])


def external_framework_rbac() -> list[dict[str, Any]]:
    """Read access to DDPJobs for Kueue's manager. Its pod webhook walks a pod's owners up to a job kind it
    knows (``FindAncestorJobManagedByKueue``), reading each through its informer cache; for an external
    framework that means a watch on its kind. The chart grants that only for the built-in kinds: without this,
    the cache never syncs and every pod a DDPJob owns times out in the webhook ("context deadline exceeded")."""
    name = "kueue-external-framework-ddpjob"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{"apiGroups": ["ddpjob.dev"], "resources": ["ddpjobs"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        },
    ]


def resource_flavor_probe() -> dict[str, Any]:
    """A ResourceFlavor to create with a server-side dry run: it passes Kueue's mutating and validating
    webhooks, so it succeeds only once the apiserver reaches them through their Service."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "box-webhook-probe"},
    }


def progress(what: str, started: float) -> None:
    print(f"kueue: {what} ({time.monotonic() - started:.0f}s)", flush=True)


@dataclass
class Kueue:
    """Kueue installed into one box: ``install``, then ``stop`` and ``start`` its manager for tests."""

    kubeconfig: Path
    image: str
    # The node its manager runs on
    node: str
    # The values file and helm's own config, cache and data directories (kept out of $HOME)
    workdir: Path
    installed: bool = False
    # waitForPodsReady's timeout, when not WAIT_FOR_PODS_READY's
    pods_ready_timeout: str = ""

    def install(self, timeout: float = 300) -> None:
        """helm install the chart, then wait until the manager is Available and its webhooks answer."""
        started = time.monotonic()
        chart = chart_dir()
        self.workdir.mkdir(parents=True, exist_ok=True)
        values = self.workdir / "values.yaml"
        values.write_text(
            yaml.safe_dump(chart_values(self.image, shipped_manager_config(chart), self.node, self.pods_ready_timeout))
        )
        # Before the manager starts, so its first watch of DDPJobs succeeds.
        rbac = self.workdir / "external-framework-rbac.json"
        rbac.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": external_framework_rbac()}))
        self.kubectl("apply", "-f", str(rbac))
        # upgrade --install: a box restarted on its --data-dir still has the release in its etcd
        self.helm(
            "upgrade",
            "--install",
            RELEASE,
            str(chart),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "-f",
            str(values),
        )
        self.installed = True
        progress(f"chart {chart.parent.parent.name} installed into {NAMESPACE}", started)
        self.wait_ready(timeout, started)

    def wait_ready(self, timeout: float = 300, started: float | None = None) -> None:
        """The manager Available, its webhooks answering through their Service, and its visibility API
        served (an unavailable aggregated API fails discovery, and with it namespace deletion)."""
        started = time.monotonic() if started is None else started
        deadline = started + timeout
        self._wait("the manager Deployment to be Available", self.available, deadline)
        progress("manager Available", started)
        self._wait("Kueue's webhooks to answer through their Service", self.webhooks_answer, deadline)
        self._wait(f"APIService {VISIBILITY_API} to be Available", self.visibility_available, deadline)
        progress("webhooks and visibility API answer; Kueue is ready", started)

    def stop(self, timeout: float = 120) -> None:
        """Scale the manager to 0 and wait until its pod is gone: Kueue's webhooks then refuse (their
        failurePolicy is Fail), as in a cluster whose Kueue is down."""
        started = time.monotonic()
        self.kubectl("scale", "deployment", DEPLOYMENT, "-n", NAMESPACE, "--replicas=0")
        self._wait("Kueue's pod to be gone", lambda: not self.pods(), started + timeout)
        progress("manager stopped", started)

    def start(self, timeout: float = 180) -> None:
        """Scale the manager back to 1 and wait until it is ready again."""
        started = time.monotonic()
        self.kubectl("scale", "deployment", DEPLOYMENT, "-n", NAMESPACE, "--replicas=1")
        self.wait_ready(timeout, started)

    def kill(self) -> str:
        """Delete the manager's pod at once (grace 0), as a crash: its Deployment starts another. Returns the
        deleted pod's name; ``wait_ready`` waits for the new one."""
        pods = self.pods()
        if not pods:
            raise BoxError("Kueue has no pod to kill: start it first")
        self.kubectl("delete", "pod", "-n", NAMESPACE, pods[0], "--grace-period=0", "--wait=false")
        return pods[0]

    def pods(self) -> list[str]:
        out = self.kubectl("get", "pods", "-n", NAMESPACE, "-l", POD_SELECTOR, "-o", "name")
        return [line.split("/", 1)[1] for line in out.split()]

    def available(self) -> bool:
        deployment = self._get("deployment", DEPLOYMENT, "-n", NAMESPACE)
        status = (deployment or {}).get("status") or {}
        # Only the new pod counts: a replaced one may still be Ready while it terminates.
        return bool(
            status.get("availableReplicas")
            and status.get("updatedReplicas") == status.get("replicas")
            and status.get("observedGeneration") == (deployment or {}).get("metadata", {}).get("generation")
        )

    def webhooks_answer(self) -> bool:
        probe = json.dumps(resource_flavor_probe())
        return self.try_kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", stdin=probe).returncode == 0

    def visibility_available(self) -> bool:
        service = self._get("apiservice", VISIBILITY_API) or {}
        conditions = (service.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)

    def configuration(self) -> dict[str, Any]:
        """The Configuration the manager runs with, as its ConfigMap holds it."""
        config_map = self._get("configmap", CONFIG_MAP, "-n", NAMESPACE) or {}
        return dict(yaml.safe_load((config_map.get("data") or {}).get(CONFIG_KEY) or "{}") or {})

    def log_tail(self, lines: int = 40) -> str:
        proc = self.try_kubectl("logs", "-n", NAMESPACE, f"deployment/{DEPLOYMENT}", f"--tail={lines}", timeout=20)
        return proc.stdout or proc.stderr

    def helm(self, *args: str) -> str:
        helm = toolchain.ensure(toolchain.helm_build(), quiet=True)["helm"]
        env = dict(
            os.environ,
            HELM_CACHE_HOME=str(self.workdir / "helm" / "cache"),
            HELM_CONFIG_HOME=str(self.workdir / "helm" / "config"),
            HELM_DATA_HOME=str(self.workdir / "helm" / "data"),
        )
        proc = subprocess.run(
            [str(helm), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            raise BoxError(f"helm {' '.join(args[:2])} failed: {proc.stderr.strip()}")
        return proc.stdout

    def kubectl(self, *args: str) -> str:
        proc = self.try_kubectl(*args)
        if proc.returncode != 0:
            raise BoxError(f"kubectl {' '.join(args[:3])} failed: {proc.stderr.strip()}")
        return proc.stdout

    def apply(self, manifests: str) -> None:
        """``kubectl apply`` of YAML documents (Kueue's webhooks serve by now: they check each object)."""
        proc = self.try_kubectl("apply", "-f", "-", stdin=manifests)
        if proc.returncode != 0:
            raise BoxError(f"kubectl apply of Kueue's objects failed: {proc.stderr.strip()}")

    def try_kubectl(
        self, *args: str, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        kubectl = toolchain.ensure(toolchain.kubernetes_build(), quiet=True)["kubectl"]
        return subprocess.run(
            [str(kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _get(self, *args: str) -> dict[str, Any] | None:
        proc = self.try_kubectl("get", *args, "-o", "json")
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        while not ready():
            if time.monotonic() > deadline:
                raise BoxError(f"timed out waiting for {what}; Kueue's log:\n{self.log_tail()}")
            time.sleep(1)
