"""The local node plays the kubelet's part: real processes, honest status, namespaces, volumes and restarts."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from kubernetes import client

from ddpjob_box.box import NODE_NAME, LocalNode
from tests.e2e.kube import pod_phase, python_pod, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def core(api_client: Any, local_node: LocalNode) -> Any:
    return client.CoreV1Api(api_client)


def _container_pid(node: LocalNode, core: Any, name: str, namespace: str) -> int:
    uid = core.read_namespaced_pod(name, namespace).metadata.uid
    pid_file = node.pod_dir(uid) / "c-main" / "pid"
    wait_for(f"{name}'s process", pid_file.exists, 30)
    return int(pid_file.read_text().split()[0])


def test_the_node_registers_with_its_real_capacity_and_stays_ready(core: Any) -> None:
    node = core.read_node(NODE_NAME)
    assert node.status.capacity["cpu"] == str(os.cpu_count())
    assert "nvidia.com/gpu" not in node.status.capacity
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "True"
    lease = client.CoordinationV1Api(core.api_client).read_namespaced_lease(NODE_NAME, "kube-node-lease")
    assert lease.spec.holder_identity == NODE_NAME


def test_a_pod_runs_as_a_process_and_reports_its_exit_code(core: Any, namespace: str) -> None:
    core.create_namespaced_pod(namespace, python_pod("ok", "print('hi')"))
    core.create_namespaced_pod(namespace, python_pod("bad", "import sys; sys.exit(3)"))
    wait_for("ok to succeed", lambda: pod_phase(core, "ok", namespace) == "Succeeded", 120)
    wait_for("bad to fail", lambda: pod_phase(core, "bad", namespace) == "Failed", 120)
    ok = core.read_namespaced_pod("ok", namespace)
    assert ok.spec.node_name == NODE_NAME, "bound by kube-scheduler"
    assert ok.status.pod_ip and ok.status.start_time
    assert ok.status.container_statuses[0].state.terminated.reason == "Completed"
    bad = core.read_namespaced_pod("bad", namespace).status.container_statuses[0].state.terminated
    assert (bad.exit_code, bad.reason) == (3, "Error")


def test_a_running_pod_is_ready_with_its_ip_and_the_downward_api(core: Any, namespace: str) -> None:
    code = "import os, time; print(os.environ['MY_IP'], os.environ['MY_NAME'], flush=True); time.sleep(60)"
    env = [
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    core.create_namespaced_pod(namespace, python_pod("runner", code, container={"env": env}))
    wait_for("runner to run", lambda: pod_phase(core, "runner", namespace) == "Running", 120)
    pod = core.read_namespaced_pod("runner", namespace)
    assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)
    log = wait_for("the pod's output", lambda: _log(core, pod), 30)
    assert log.split() == [pod.status.pod_ip, "runner"]


def _pod_dir(pod: Any) -> Any:
    from tests.conftest import _BOX

    assert _BOX is not None and _BOX.node is not None
    return _BOX.node.pod_dir(pod.metadata.uid)


def _log(core: Any, pod: Any) -> str:
    path = _pod_dir(pod) / "c-main" / "log"
    return path.read_text() if path.exists() else ""


def test_a_foreign_image_waits_with_err_image_never_pull_and_never_runs(core: Any, namespace: str) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "foreign"},
            "spec": {"containers": [{"name": "main", "image": "docker.io/library/busybox:1.36"}]},
        },
    )

    def waiting_reason() -> str | None:
        statuses = core.read_namespaced_pod("foreign", namespace).status.container_statuses or []
        return statuses[0].state.waiting.reason if statuses and statuses[0].state.waiting else None

    assert wait_for("a waiting reason", waiting_reason, 60) == "ErrImageNeverPull"
    assert core.read_namespaced_pod("foreign", namespace).status.phase == "Pending"


def test_pods_behind_a_headless_service_resolve_each_other_by_cluster_dns_name(core: Any, namespace: str) -> None:
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "grp"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"grp": "a"},
                "ports": [{"port": 80}],
            },
        },
    )
    code = (
        "import socket; print(socket.gethostname(), socket.gethostbyname('grp-0.grp'), "
        f"socket.gethostbyname('grp-1.grp.{namespace}.svc.cluster.local'))"
    )
    for rank in range(2):
        core.create_namespaced_pod(
            namespace, python_pod(f"grp-{rank}", code, hostname=f"grp-{rank}", subdomain="grp", labels={"grp": "a"})
        )
    for rank in range(2):
        wait_for(f"grp-{rank} to succeed", lambda r=rank: pod_phase(core, f"grp-{r}", namespace) == "Succeeded", 120)
    ips = [core.read_namespaced_pod(f"grp-{r}", namespace).status.pod_ip for r in range(2)]
    for rank in range(2):
        pod = core.read_namespaced_pod(f"grp-{rank}", namespace)
        assert _log(core, pod).split() == [f"grp-{rank}", ips[0], ips[1]]


def test_deleting_a_pod_sends_sigterm_then_sigkill_after_the_grace_period(core: Any, namespace: str) -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('got SIGTERM', flush=True))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    core.create_namespaced_pod(namespace, python_pod("stubborn", code, terminationGracePeriodSeconds=3))
    wait_for("stubborn to run", lambda: pod_phase(core, "stubborn", namespace) == "Running", 120)
    pod = core.read_namespaced_pod("stubborn", namespace)
    wait_for("the handler to be installed", lambda: "ready" in _log(core, pod), 30)
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", namespace)
    wait_for(
        "the pod object to go",
        lambda: "stubborn" not in [p.metadata.name for p in core.list_namespaced_pod(namespace).items],
        60,
    )
    assert time.monotonic() - started >= 3, "SIGKILL waits out the grace period"


def test_restarting_the_node_agent_neither_loses_nor_duplicates_a_running_pod(
    core: Any, namespace: str, local_node: LocalNode
) -> None:
    code = "import time; time.sleep(6); print('done', flush=True)"
    core.create_namespaced_pod(namespace, python_pod("survivor", code))
    wait_for("survivor to run", lambda: pod_phase(core, "survivor", namespace) == "Running", 120)
    pid = _container_pid(local_node, core, "survivor", namespace)
    local_node.restart()
    os.kill(pid, 0)  # the process outlived the agent
    wait_for("survivor to succeed", lambda: pod_phase(core, "survivor", namespace) == "Succeeded", 120)
    pod = core.read_namespaced_pod("survivor", namespace)
    assert _log(core, pod).count("done") == 1, "ran exactly once"
    assert pod.status.container_statuses[0].restart_count == 0


def test_pods_mounting_one_claim_share_its_directory(core: Any, namespace: str) -> None:
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "shared"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    mount = {"volumeMounts": [{"name": "data", "mountPath": "/mnt/ddpjob-test-shared"}]}
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}]
    core.create_namespaced_pod(
        namespace,
        python_pod("writer", "open('/mnt/ddpjob-test-shared/x', 'w').write('42')", container=mount, volumes=volumes),
    )
    wait_for("writer to succeed", lambda: pod_phase(core, "writer", namespace) == "Succeeded", 120)
    core.create_namespaced_pod(
        namespace,
        python_pod(
            "reader", "assert open('/mnt/ddpjob-test-shared/x').read() == '42'", container=mount, volumes=volumes
        ),
    )
    wait_for("reader to succeed", lambda: pod_phase(core, "reader", namespace) == "Succeeded", 120)
    # after the pod's status is written, so not at once
    wait_for("the node to remove the mount points it made", lambda: not os.path.exists("/mnt/ddpjob-test-shared"), 30)


def test_a_sigstopped_process_is_still_reported_running(core: Any, namespace: str, local_node: LocalNode) -> None:
    core.create_namespaced_pod(namespace, python_pod("frozen", "import time; time.sleep(30)"))
    wait_for("frozen to run", lambda: pod_phase(core, "frozen", namespace) == "Running", 120)
    pid = _container_pid(local_node, core, "frozen", namespace)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(2)
        assert pod_phase(core, "frozen", namespace) == "Running"
    finally:
        os.kill(pid, signal.SIGCONT)


def test_init_containers_run_in_order_before_the_app_container(core: Any, namespace: str) -> None:
    shared = [{"name": "scratch", "mountPath": "/mnt/ddpjob-test-scratch"}]
    inits = [
        {
            "name": f"step{n}",
            "image": "ghcr.io/ddpjob/trainer:dev",
            "volumeMounts": shared,
            "command": ["sh", "-c", f"echo {n} >> /mnt/ddpjob-test-scratch/order"],
        }
        for n in (1, 2)
    ]
    code = "assert open('/mnt/ddpjob-test-scratch/order').read().split() == ['1', '2']"
    core.create_namespaced_pod(
        namespace,
        python_pod(
            "inits",
            code,
            initContainers=inits,
            container={"volumeMounts": shared},
            volumes=[{"name": "scratch", "emptyDir": {}}],
        ),
    )
    wait_for("inits to succeed", lambda: pod_phase(core, "inits", namespace) == "Succeeded", 120)
    statuses = core.read_namespaced_pod("inits", namespace).status.init_container_statuses
    assert [s.state.terminated.exit_code for s in statuses] == [0, 0]


def test_a_failing_init_container_fails_the_pod_without_starting_the_app(core: Any, namespace: str) -> None:
    inits = [{"name": "nope", "image": "ghcr.io/ddpjob/trainer:dev", "command": ["sh", "-c", "exit 7"]}]
    core.create_namespaced_pod(namespace, python_pod("blocked", "print('never')", initContainers=inits))
    wait_for("blocked to fail", lambda: pod_phase(core, "blocked", namespace) == "Failed", 120)
    pod = core.read_namespaced_pod("blocked", namespace)
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 7
    assert pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"


def test_a_pod_with_a_service_account_gets_a_token_and_a_kubeconfig_that_work(core: Any, namespace: str) -> None:
    code = (
        "import os\n"
        "from kubernetes import client, config\n"
        "config.load_kube_config()\n"
        "v1 = client.CoreV1Api()\n"
        "try:\n"
        "    v1.list_namespaced_pod(os.environ['NS'])\n"
        "except client.ApiException as err:\n"
        "    print('status', err.status, flush=True)\n"
        "config.load_incluster_config()\n"
        "try:\n"
        "    client.CoreV1Api().list_namespaced_secret(os.environ['NS'])\n"
        "except client.ApiException as err:\n"
        "    print('status', err.status, flush=True)\n"
        "import ssl, urllib.request\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "ctx = ssl.create_default_context(cafile=f'{sa}/ca.crt')\n"
        "auth = {'Authorization': 'Bearer ' + open(f'{sa}/token').read()}\n"
        "request = urllib.request.Request('https://kubernetes.default.svc/api', headers=auth)\n"
        "print('status', urllib.request.urlopen(request, context=ctx).status, flush=True)\n"
    )
    env = [{"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    core.create_namespaced_pod(namespace, python_pod("sa", code, container={"env": env}))
    wait_for("sa to succeed", lambda: pod_phase(core, "sa", namespace) == "Succeeded", 120)
    pod = core.read_namespaced_pod("sa", namespace)
    # The apiserver authenticated the token as the pod's ServiceAccount, which has no role: 403, not 401.
    assert _log(core, pod).split() == ["status", "403", "status", "403", "status", "200"]
    env_file = next(p for p in _pod_dir(pod).glob("c-main/env.json"))
    assert '"KUBECONFIG": "/var/run/secrets/kubernetes.io/serviceaccount/kubeconfig"' in env_file.read_text()
