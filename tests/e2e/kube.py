"""Small helpers for end-to-end tests: waiting on pods, reading their logs, finding their processes.

The operator replaces pods (a gang restart deletes every rank's pod and makes it again under the same name), so a
pod read by name may be absent for a moment at any time: a probe takes that as "not yet" (``Jobs.find_pod``), and
a read that needs the pod fails the test saying so, with its job's status (``Jobs.pod``).
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ddpjob_box import processes
from ddpjob_box.kubenode.node import KubeletNode

T = TypeVar("T")


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.3, seen: Callable[[], Any] = str
) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test naming ``what`` otherwise, and what
    ``seen`` returns then (the state the test waited on)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            last = seen()
            said = f"; last seen: {last}" if last else ""
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}{said}", pytrace=False)
        time.sleep(interval)


def read_pod(core: Any, namespace: str, name: str) -> Any | None:
    """The pod, or None while there is none by that name (not made yet, or deleted and not made again yet)."""
    try:
        return core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        if err.status != 404:
            raise
        return None


def wait_pod_phase(core: Any, namespace: str, name: str, phases: set[str], timeout: float) -> Any:
    """The pod once its phase is one of ``phases``; fail the test naming its last phase and status otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        pod = read_pod(core, namespace, name)
        if pod is not None and pod.status.phase in phases:
            return pod
        if time.monotonic() > deadline:
            said = f"stayed {pod.status.phase} for {timeout}s: {pod.status}" if pod else f"did not exist for {timeout}s"
            pytest.fail(f"pod {name} {said}", pytrace=False)
        time.sleep(0.2)


def table(text: str) -> list[dict[str, str]]:
    """The rows of ``kubectl get``'s table, cut by its header's columns: an empty cell is a cell too."""
    header, *lines = text.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    return [
        dict(zip(names, (line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)), strict=True))
        for line in lines
    ]


def summary_samples_per_second(log: str) -> float:
    """The img/s column of the summary table a rank prints at the end of its run."""
    header = next(line for line in log.splitlines() if "| model | world |" in line)
    row = log.splitlines()[log.splitlines().index(header) + 2]
    columns = [c.strip() for c in header.split("|")]
    return float(row.split("|")[columns.index("img/s")])


def rank_metric(ip: str, name: str, port: int = 9090) -> float:
    """An unlabelled sample (``ddp_step``, ``ddp_steps_total``...) from a rank's own metrics endpoint; 0 while it
    does not answer or does not export it."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"


class Jobs:
    """DDPJobs of one namespace, through the API, with waits that fail the test as soon as the job fails."""

    def __init__(self, api_client: Any, namespace: str):
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.ns = namespace

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)

    def status(self, name: str) -> dict[str, Any]:
        job = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        return dict(job.get("status") or {})

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == type_), None)

    def events(self, name: str, reason: str) -> list[Any]:
        found = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return [e for e in found if e.reason == reason]

    def wait_events(self, name: str, reason: str, timeout: float = 30) -> list[Any]:
        """The job's Events of ``reason``, once there is one: the operator posts its Events off the reconcile, a
        moment after the status that a test saw change."""
        return wait_for(f"a {reason} Event for {name}", lambda: self.events(name, reason), timeout, interval=0.5)

    def wait_phase(self, name: str, phase: str, timeout: float) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            assert not (status.get("phase") == "Failed" and phase != "Failed"), f"job failed: {status}"
            return status if status.get("phase") == phase else None

        return wait_for(f"{name} to be {phase}", reached, timeout, interval=1)

    def find_pod(self, name: str) -> Any | None:
        """The pod, or None while it does not exist: for probes, which ask again."""
        return read_pod(self.core, self.ns, name)

    def pod(self, name: str) -> Any:
        """A pod the test needs now: one that is gone fails the test with its job's status (why it was replaced)."""
        found = self.find_pod(name)
        return found if found is not None else self._gone(name)

    def _gone(self, pod: str) -> NoReturn:
        job = pod.rsplit("-", 1)[0]
        pytest.fail(f"pod {pod} is gone; job {job}'s status: {self.status(job)}", pytrace=False)

    def log(self, pod: str, container: str = "trainer") -> str:
        """What the container printed, as ``kubectl logs`` shows it (kubelet's log, through the apiserver).

        A pod that is gone fails the test with its job's status, which says why the operator replaced it."""
        try:
            return str(self.core.read_namespaced_pod_log(pod, self.ns, container=container))
        except ApiException as err:
            if err.status != 404:
                raise
            self._gone(pod)

    def pid(self, node: KubeletNode, pod: str, container: str = "trainer") -> int:
        """The host PID of a pod's running container, to signal it from outside as a fault would."""

        def running_id() -> str | None:
            found_pod = self.find_pod(pod)  # made again after a restart: not yet
            statuses = (found_pod.status.container_statuses or []) if found_pod else []
            found = [s for s in statuses if s.name == container and s.state.running and s.container_id]
            return str(found[0].container_id) if found else None

        return node.container_pid(wait_for(f"{pod}'s {container} container to run", running_id, 120))

    def training_pid(self, node: KubeletNode, pod: str) -> int:
        """The host PID of a pod's training process: the child of the trainer's supervisor, where there is one
        (``MAX_RESTARTS`` above 0). Waited for, as the supervisor starts it a moment after the container starts. (The
        loop's two runs that found "the supervisor" without a child had taken a process for it by its lowest host PID,
        after PIDs wrapped: ``node.first_process`` mends that, 54c9a1d.)"""
        found = self.pod(pod)
        statuses = found.status.container_statuses or []
        running = [s.container_id for s in statuses if s.name == "trainer" and s.state.running and s.container_id]
        assert running, f"{pod}'s trainer is not running"
        container = str(running[0])
        env = {e.name: e.value for c in found.spec.containers if c.name == "trainer" for e in c.env or []}
        if int(env.get("MAX_RESTARTS") or 0) <= 0:
            return node.training_pid(container)
        main = node.container_pid(container)

        def children() -> str:
            return f"the supervisor {main}'s children: {sorted(processes.children(main)) or 'none'}"

        return wait_for(
            f"{pod}'s training process under its supervisor",
            lambda: next((pid for pid in [node.training_pid(container)] if pid != main), None),
            30,
            seen=children,
        )

    def wait_running(self, name: str, timeout: float) -> dict[str, Any]:
        """Running, which the operator reports only once every rank joined the process group."""
        return self.wait_phase(name, "Running", timeout)
