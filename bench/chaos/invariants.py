"""The promises the chaos soak checks: during a run, the ``Watchdog`` (never two live pods for one rank, nor pods of
two attempts but briefly while a gang restarts in place); after it, that the job ended as its faults allow
(``outcome_as_promised``, with what explains a restart more or fewer: ``never_started``, ``nodes_lost``,
``too_late``), that its checkpoints load, and that its deletion left nothing behind (``ended_as_promised``, which
waits out the control plane's own faults: ``wait_while_whole``)."""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from bench.chaos.faults import NODE_FAULTS, RESTARTING
from bench.chaos.job import STEPS, JobRef, Run
from bench.chaos.stack import Stack
from bench.common import wait_until
from ddpjob_contract.pods import ANNOTATION_RESTART_COUNT
from ddpjob_contract.status import Reason

GONE_SECONDS = 60
"""How long a deleted job's pods, Service and PodGroups may outlive it while the control plane is whole."""
RELIST_BACKOFF_SECONDS = 60
"""The longest a client-go informer waits before it lists again after failed ones (its backoff stops at
[30, 60) s; client-go tools/cache/reflector.go, defaultBackoffMax with jitter 1.0): after a box fault the
garbage collector may look again this late, and several faults in a row make that likely (soak 10, 1:93)."""
GONE_CAP_SECONDS = 300
NAMESPACE_GONE_SECONDS = 120
"""How long a deleted namespace may take to go while the control plane is whole (its pods' grace included)."""
MIXED_ATTEMPTS_SECONDS = 60.0
"""Longest a gang restarting in place may have pods of two attempts: the last ranks' wait (``in_place.WAIT_SECONDS``),
their grace period when deleted (30 s), and slack for a loaded machine."""


class Watchdog:
    """Polls the job's pods until stopped and records what must never be seen."""

    def __init__(self, stack: Stack, job: JobRef) -> None:
        self.stack, self.job = stack, job
        self.violations: list[str] = []
        self._mixed_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                pods = self.stack.core.list_namespaced_pod(
                    self.job.namespace, label_selector=f"ddpjob.dev/job-name={self.job.name}"
                ).items
            except Exception:  # the apiserver may be restarting: look again
                continue
            live = [p for p in pods if not p.metadata.deletion_timestamp and p.status.phase in ("Pending", "Running")]
            ranks = Counter(p.metadata.labels.get("ddpjob.dev/rank") for p in live)
            attempts = {p.metadata.labels.get("ddpjob.dev/attempt") for p in live}
            for rank, count in ranks.items():
                if count > 1:
                    self._say(f"{count} live pods for rank {rank}")
            self._attempts(live, attempts)

    def _attempts(self, live: list[Any], attempts: set[str | None]) -> None:
        """Pods of two attempts at once: never when the gang is recreated (the old pods go first). Restarted in
        place, the ranks' pods move into the next attempt one by one as each exits (each is adopted once its
        kubelet restarts it), so the two may overlap while the last ranks exit, or are deleted after
        ``in_place.WAIT_SECONDS``, and no longer than ``MIXED_ATTEMPTS_SECONDS``."""
        if len(attempts) <= 1:
            self._mixed_since = None
            return
        adopted = any(ANNOTATION_RESTART_COUNT in (p.metadata.annotations or {}) for p in live)
        if not adopted:
            self._say(f"live pods of attempts {sorted(str(a) for a in attempts)} at once")
            return
        now = time.monotonic()
        self._mixed_since = self._mixed_since or now
        if now - self._mixed_since > MIXED_ATTEMPTS_SECONDS:
            named = sorted(str(a) for a in attempts)
            self._say(f"live pods of attempts {named} at once for over {MIXED_ATTEMPTS_SECONDS:.0f}s in place")

    def _say(self, what: str) -> None:
        if what not in self.violations:
            self.violations.append(what)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        return self.violations


def wait_while_whole(stack: Stack, what: str, probe: Callable[[], Any], timeout: float) -> Any:
    """As wait, with ``timeout`` counted from RELIST_BACKOFF_SECONDS after the end of the last box fault when
    that came later: the garbage collector and the controller-manager's other controllers stop while the
    apiserver or etcd restarts, and after it they relist when their backoff lets them, so that time is not
    the job's. At most GONE_CAP_SECONDS in all. While a node is cut, the wait goes on (a pod deleted there goes
    once its kubelet is back: chaos 1:6, 1:9 and 1:10 of 2026-11-29, whose finished pods sat on another run's
    network-cut node), and ``timeout`` and the cap count from when it came back."""
    started = time.monotonic()

    def deadline() -> float:
        if stack.nodes_whole_since == math.inf:
            return time.monotonic() + timeout
        relisted = stack.whole_since + RELIST_BACKOFF_SECONDS
        since = max(started, relisted, stack.nodes_whole_since)
        return min(since + timeout, max(started, stack.nodes_whole_since) + GONE_CAP_SECONDS)

    return wait_until(what, probe, deadline)


def never_started(events: Sequence[str]) -> int:
    """The gang restarts whose cause was a container that never ran (kubelet's StartError, exit 128): a kubelet
    restart, this run's or another's, that lands while kubelet starts a container costs a restart, as it would
    in any cluster (soak 10, run 1:148)."""
    return sum(event.startswith("RetryableFailure:") and "(StartError" in event for event in events)


def too_late(fault: str, ended: dict[str, Any]) -> str:
    """Why a fault that costs a restart did not, in a job that Succeeded in the same attempt ("" if nothing
    explains it, and the restart count flags it). The final step is still checked either way."""
    succeeded: dict[str, Any] = next((c for c in ended.get("conditions") or [] if c.get("type") == "Succeeded"), {})
    if fault == "delete-pod" and succeeded.get("reason") == Reason.ALL_SUCCEEDED:
        return "every rank had exited 0, and the pod of one was deleted after"
    if fault == "hang-rank" and succeeded.get("reason") == Reason.STUCK_EXITING:
        # A peer exited 0 after the last barrier: the training was done, and the stopped rank was exiting.
        return f"the job Succeeded with the stopped rank stuck exiting ({succeeded.get('message')})"
    if fault == "network-cut" and succeeded.get("reason") in (Reason.ALL_SUCCEEDED, Reason.STUCK_EXITING):
        # Behind the cut the rank trains on: the job may end before its node is marked lost.
        return f"the job Succeeded before the cut node was marked lost ({succeeded.get('reason')})"
    if fault == "power-cut" and succeeded.get("reason") == Reason.ALL_SUCCEEDED:
        return "every rank had exited 0 before the power cut"
    return ""  # a killed rank cannot exit 0; a stopped one that is not named stuck exiting should restart


def outcome_as_promised(result: Run) -> list[str]:
    """A job that ran to its end: Succeeded at the last step with a restart per fault that costs one, or, when
    those were more than its backoffLimit, Failed with BackoffLimitExceeded after that many restarts."""
    if result.outcome not in ("Succeeded", "Failed"):
        return []  # deleted, or timed out (already a violation)
    costly = (*RESTARTING, *NODE_FAULTS)
    expected = sum(f in costly for f in result.faults if f not in result.skipped) + never_started(result.events)
    cut = sum(f in NODE_FAULTS for f in result.faults if f not in result.skipped)
    uncut = max(0, nodes_lost(result.events) - cut - result.node_hits)
    most = expected + result.node_hits + uncut  # another run's node cut may have hit this job too
    limit = result.backoff_limit
    hit = f", {result.node_hits} other runs' node cuts under it" if result.node_hits else ""
    if uncut:
        hit += f", {uncut} node(s) lost that no run cut (a kubelet or control-plane fault past the grace period)"
    if expected > limit or (most > limit and (result.outcome, result.reason) == ("Failed", Reason.BACKOFF)):
        if (result.outcome, result.reason) != ("Failed", Reason.BACKOFF):
            return [f"{result.outcome} ({result.reason}), expected Failed ({Reason.BACKOFF}): faults {result.faults} "
                    f"cost {expected} restarts, backoffLimit {limit}"]  # fmt: skip
        return [] if result.restarts == limit else [f"restarts {result.restarts}, expected {limit} before it failed"]
    violations = []
    if result.outcome == "Failed":
        violations.append(f"the job failed ({result.reason}): faults {result.faults}{hit}, backoffLimit {limit}")
    elif not expected <= result.restarts <= most:
        want = f"{expected}" if most == expected else f"{expected}-{most}"
        violations.append(f"restarts {result.restarts}, expected {want} (faults {result.faults}{hit})")
    if result.outcome == "Succeeded" and result.step != STEPS:
        violations.append(f"final step {result.step}, expected {STEPS}")
    return violations


_LOST = re.compile(rf"{Reason.NODE_LOST}: node (\S+) is lost \(.*?since (\S+?)\)")


def nodes_lost(events: Sequence[str]) -> int:
    """How many times the operator found a node of the job lost (its NodeLost Events, one per node and time it went
    lost), each worth one restart at most, whether it restarted the gang itself or found the restart its peers'
    failure had begun already ("already counted"). A node no run cut is lost too when a kubelet restart or a
    control-plane fault keeps its status unwritten past the controller-manager's grace period (NODE_GRACE: 10 s):
    chaos 1:22 and 1:24 of 2026-11-29, under a hung rank, each restarted once more for a node that went Unknown
    with no cut."""
    return len({found.groups() for e in events if (found := _LOST.match(e))})


def ended_as_promised(stack: Stack, job: JobRef, result: Run, deleted: str) -> list[str]:
    """What the run's end broke: the restarts and steps of a finished job, its checkpoints, and what deleting
    it (the harness, or the fault that ended the run) left behind."""
    violations = outcome_as_promised(result)
    if deleted != "delete-namespace":  # the namespace took the claim with it
        violations += checkpoints_load(stack, job)
    if not deleted:
        stack.delete_job(job)
    left: list[str] = []

    def gone() -> bool:
        left[:] = children_left(stack, job)
        return not left

    try:
        wait_while_whole(stack, "the job's pods, Service and PodGroups to go", gone, GONE_SECONDS)
    except TimeoutError as err:
        violations.append(f"{err}; left: {'; '.join(left)}")
    if deleted == "delete-namespace":
        try:
            wait_while_whole(
                stack, f"namespace {job.namespace} to go", lambda: stack.namespace_gone(job.namespace),
                NAMESPACE_GONE_SECONDS,
            )  # fmt: skip
        except TimeoutError as err:
            violations.append(str(err))
    else:
        stack.delete_claim(job)
    return violations


def checkpoints_load(stack: Stack, job: JobRef) -> list[str]:
    """Every complete checkpoint in the claim's directory loads; returns what did not."""
    import torch

    from ddp_trainer import checkpoint

    pvc = stack.call(stack.core.read_namespaced_persistent_volume_claim, job.claim, job.namespace)
    volume = stack.call(stack.core.read_persistent_volume, pvc.spec.volume_name)
    directory = volume.spec.host_path.path
    bad = []
    for step, path in checkpoint.complete(directory):
        try:
            torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:  # a corrupt file is what this looks for
            bad.append(f"checkpoint of step {step} does not load: {err}")
    return bad


def children_left(stack: Stack, job: JobRef) -> list[str]:
    """The job's pods, Service and PodGroups that still exist, each with what holds it (a deletion under way,
    a finalizer)."""
    selector = f"ddpjob.dev/job-name={job.name}"
    pods = stack.call(stack.core.list_namespaced_pod, job.namespace, label_selector=selector).items
    services = stack.call(stack.core.list_namespaced_service, job.namespace, label_selector=selector).items
    groups = stack.call(
        stack.custom.list_namespaced_custom_object,
        "scheduling.k8s.io", "v1beta1", job.namespace, "podgroups", label_selector=selector,
    )["items"]  # fmt: skip
    left = [held("Pod", p.metadata.name, p.metadata.deletion_timestamp, p.metadata.finalizers) for p in pods]
    if stack.kueue:
        workloads = stack.call(
            stack.custom.list_namespaced_custom_object,
            "kueue.x-k8s.io", "v1beta2", job.namespace, "workloads", label_selector=selector,
        )["items"]  # fmt: skip
        for workload in workloads:
            meta = workload["metadata"]
            left.append(held("Workload", meta["name"], meta.get("deletionTimestamp"), meta.get("finalizers")))
    left += [held("Service", s.metadata.name, s.metadata.deletion_timestamp, s.metadata.finalizers) for s in services]
    for group in groups:
        meta = group["metadata"]
        left.append(held("PodGroup", meta["name"], meta.get("deletionTimestamp"), meta.get("finalizers")))
    return left


def held(kind: str, name: str, deleting: object, finalizers: list[str] | None) -> str:
    return (
        f"{kind} {name}"
        + (f" (deleting since {deleting})" if deleting else "")
        + (f" (finalizers {', '.join(finalizers)})" if finalizers else "")
    )
