"""Chaos soak: seeded faults against the whole box, with the operator's promises checked after each run.

    python -m bench.chaos --runs 10 --seed 1        # make test runs a short set (tests/e2e/test_chaos.py)
    python -m bench.chaos --runs 200 --seed 1 --parallel 4   # make soak: 4 jobs at a time
    python -m bench.chaos --replay 1:37             # run 37 of seed 1 again, alone
    python -m bench.chaos --replay 1:37,1:38        # those two again, side by side
    python -m bench.chaos --runs 40 --kueue         # Kueue in the box, every job queued, two more faults
    python -m bench.chaos --runs 40 --nodes 3 --parallel 4   # 3 real nodes, and node faults

The box with its node, the trainer image, and the operator as its own process, watching one namespace
per run going on at once (the chart's namespaced mode). Each run creates a 2-rank tinycnn DDPJob that
checkpoints every 10 steps in a namespace no other run uses meanwhile, then injects 1 to 3 faults
chosen and timed by ``random.Random(f"{seed}:{run}")``, each once the job runs again, and waits for the
job to end: a killed rank (its training process, which its supervisor restarts in place, or its container's first
process), a hung one (its training process SIGSTOPped) or a deleted one; the operator SIGKILLed, or armed at a fault
point (``ddpjob_contract.faults``: it exits at its next pod creation or deletion, in whichever job's work);
kubelet, kube-apiserver or etcd restarted; suspend then resume; a spec edit (what may change while it
runs, and a template change, which CEL must refuse); the job, or its whole namespace, deleted while it
runs (always the run's last fault). With ``--parallel N``, N runs go on at once: a restart of kubelet,
the apiserver, etcd or the operator then lands on every job alive at the time, and each of them must
still keep every promise (such a restart causes no counted restart). A box fault passes alone: the
other runs' calls to the apiserver wait until it answers again. Then it checks:

- never two live pods for one rank, nor live pods of two attempts (polled every 0.3 s), but while a gang restarts
  in place, for at most 60 s, as its ranks' pods move into the next attempt one by one;
- ``status.restarts`` equals the restart-causing faults injected (a killed, deleted or hung rank;
  suspend, a spec edit, the operator's, kubelet's, the apiserver's or etcd's restart cause none);
- the job Succeeded and its final step is the configured steps, or, when the faults that cost a restart
  were more than its backoffLimit (0 in every 8th run), it Failed with BackoffLimitExceeded after that
  many restarts; every checkpoint left loads (after a deletion too, unless the namespace took them);
- the operator's log holds no traceback, and the operator never exited unless a fault made it;
- once the job is deleted, no pod, Service or PodGroup of it is left after 60 s of a whole control plane
  (counted from 60 s after the end of the last box fault when that came later: informers back off that
  long; 300 s at most); a deleted namespace is gone within 120 s of it.

With ``--kueue``, the box runs Kueue, every run's namespace has a ClusterQueue of 2 slots of its own (and a
LocalQueue), every job is queued at low priority with a slot per rank, and two faults join the draw: ``preempt`` (a
high-priority job that needs the 2 slots: Kueue must evict the run's job, which the other's success readmits, and
which must still end Succeeded at the last step with no restart counted) and ``restart-kueue`` (Kueue's manager
killed, then ready again; its webhooks refuse pods meanwhile). A deleted job's Workload must go too.

With ``--nodes N``, the box has N real nodes (the controller-manager's node-monitor grace period at 10 s), the
checkpoints go to a ReadWriteMany claim, and two faults join the draw: ``power-cut`` and ``network-cut`` of the node
that runs one of the run's ranks. The node comes back once the job runs again in a later attempt (at most 120 s
later), after a drawn 0-20 s more; one node is down at a time. The cut costs the run's job exactly one restart. A
cut also hits every other run's job with a live rank on that node: each such hit may cost that job one restart
more (one, or none when the cut merged into a restart already under way), and it is checked as a range.

Each run is one JSON line in ``bench/results/chaos.jsonl``; a violating run keeps its faults'
timeline, the job's Events, the operator's log tail, the box's audit lines for the job's pods, Service
and PodGroups (who removed what, and when), the runs that went on beside it, and names the command that
replays it with them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import re
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    STOPPING,
    log,
    machine,
    need_trainer,
    stop_on_sigterm,
    table,
    wait_until,
    write_results,
)
from bench.node_loss import bring_back_node, cut_node
from ddpjob_box import audit, images
from ddpjob_box.processes import LAST_ERROR_SAID
from ddpjob_box.provisioner import SHARED_STORAGE_CLASS
from ddpjob_contract import faults as operator_faults
from ddpjob_contract.kueue import LABEL_PRIORITY_CLASS, LABEL_QUEUE_NAME
from ddpjob_contract.pods import ANNOTATION_RESTART_COUNT
from ddpjob_contract.status import Reason

NAME = "chaos"
SLOT = "example.com/slot"
GROUP, VERSION, PLURAL = "ddpjob.dev", "v1alpha1", "ddpjobs"
STEPS = 120
GONE_SECONDS = 60
"""How long a deleted job's pods, Service and PodGroups may outlive it while the control plane is whole."""
RELIST_BACKOFF_SECONDS = 60
"""The longest a client-go informer waits before it lists again after failed ones (its backoff stops at
[30, 60) s; client-go tools/cache/reflector.go, defaultBackoffMax with jitter 1.0): after a box fault the
garbage collector may look again this late, and several faults in a row make that likely (soak 10, 1:93)."""
GONE_CAP_SECONDS = 300
RESTARTING = ("kill-rank", "delete-pod", "hang-rank")
"""Faults that cost the job one counted restart."""
BOX_FAULTS = ("kill-operator", "kill-operator-at-point", "restart-kubelet", "restart-apiserver", "restart-etcd")
"""Faults on the box itself: every job alive at the time sees them."""
ENDING = ("delete-job", "delete-namespace")
"""Faults that end the run: the job, or its whole namespace, deleted while it runs. Drawn, they come last."""
OPERATOR_POINTS = ("pod-created:1", "pod-created:2", "pod-deleted:1")
"""Where kill-operator-at-point arms the operator (ddpjob_contract.faults): it exits at its next pass there,
in whichever job's work brings it, between one rank's pod and the next, or mid gang restart."""
NAMESPACE_GONE_SECONDS = 120
"""How long a deleted namespace may take to go while the control plane is whole (its pods' grace included)."""
BACKOFF_LIMIT = 5
SPARELESS_EVERY = 8
"""Every 8th run's job has ``backoffLimit: 0``: a fault that costs a restart must end it Failed with
BackoffLimitExceeded instead."""
FAULTS = (*RESTARTING, *BOX_FAULTS, "suspend-resume", "spec-edit", *ENDING)
KUEUE_FAULTS = ("preempt", "restart-kueue")
NODE_FAULTS = ("power-cut", "network-cut")
"""With --nodes N (N > 1): the node of one of the run's ranks loses its power or its network, and comes back once
the job runs again elsewhere (or after NODE_DOWN_SECONDS). One restart, NodeLost, for the run's job; any other run's
job with a live rank there restarts too, counted as a restart it may have (``Run.node_hits``). One node is down at
a time."""
NODE_DOWN_SECONDS = 120
"""The longest a cut node stays down."""
NODE_GRACE = ("--node-monitor-grace-period=10s", "--node-monitor-period=2s")
"""The controller-manager's, with several nodes (as bench.node_loss, and as kind or kubeadm users shorten it)."""
"""With --kueue: a high-priority job takes the run's quota (Kueue evicts the run's job, which must resume from its
checkpoint once the other is done, with no restart counted), and Kueue's manager killed and started again."""
QUEUE, LOW, HIGH = "user-queue", "low-priority", "high-priority"
PREEMPT_SECONDS = 120
MIXED_ATTEMPTS_SECONDS = 60.0
"""Longest a gang restarting in place may have pods of two attempts: the last ranks' wait (``in_place.WAIT_SECONDS``),
their grace period when deleted (30 s), and slack for a loaded machine."""
"""How long a preemptor may take to evict a running job (Kueue's scheduling cycle, the operator's 2 s look)."""


@dataclass
class Run:
    seed: int
    run: int
    faults: list[str]
    outcome: str = ""
    restarts: int = -1
    step: int = -1
    reason: str = ""
    """The reason on the condition the job ended with."""
    backoff_limit: int = BACKOFF_LIMIT
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Faults not injected (the job had ended, or the rank's process had just gone), or a pod deleted too late
    to cost a restart (every rank of that attempt had already exited 0)."""
    timeline: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    operator_log: str = ""
    removals: list[str] = field(default_factory=list)
    """On a violation, every deletion of this job's pods, Service and PodGroups, and every change to its
    PodGroups (a finalizer's removal), that the apiserver answered: when, who, which."""
    alongside: list[int] = field(default_factory=list)
    """The runs of the same seed that went on at some moment of this one."""
    node_hits: int = 0
    """Other runs' node cuts under a live rank of this run's job: each may cost it one restart more."""

    @property
    def replay(self) -> str:
        together = ",".join(f"{self.seed}:{run}" for run in sorted({self.run, *self.alongside}))
        return f"python -m bench.chaos --replay {together}"


def backoff_limit(index: int) -> int:
    return 0 if index % SPARELESS_EVERY == SPARELESS_EVERY - 1 else BACKOFF_LIMIT


def chaos_job(name: str, claim: str, backoff_limit: int, *, kueue: bool = False) -> dict[str, Any]:
    """The run's job; with ``kueue``, queued in the namespace's LocalQueue at low priority, a slot per rank."""
    args = ["--model", "tinycnn", "--image-size", "16", "--batch-size", "8", "--num-workers", "0",
            "--log-interval", "5", "--steps", str(STEPS), "--checkpoint-interval", "10",
            "--slow-rank", "0", "--slow-seconds", "0.15", "--pg-timeout-seconds", "60"]  # fmt: skip
    container: dict[str, Any] = {"name": "trainer", "image": images.image_name("trainer"), "args": args}
    labels = {}
    if kueue:
        labels = {LABEL_QUEUE_NAME: QUEUE, LABEL_PRIORITY_CLASS: LOW}
        container["resources"] = {"requests": {SLOT: "1"}, "limits": {SLOT: "1"}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DDPJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 2,
            "progressDeadlineSeconds": 20,  # a hung (SIGSTOPped) rank is restarted well before the 60 s timeout
            "runPolicy": {"backoffLimit": backoff_limit},
            "checkpoint": {"claimName": claim},
            "template": {"spec": {"terminationGracePeriodSeconds": 5, "containers": [container]}},
        },
    }


@dataclass(frozen=True)
class JobRef:
    """Where a run's job lives: its namespace (the run's alone while it goes on), its name and its checkpoints'
    PVC."""

    namespace: str
    name: str
    claim: str


class Stack:
    """The box's parts a fault acts on, the namespaces the runs take turns in, and the operator, which a fault
    may kill or arm and which this keeps running."""

    def __init__(self, box: Any, namespaces: Sequence[str], workdir: Path, *, kueue: bool = False) -> None:
        from kubernetes import client, config

        from ddpjob_box.operator_process import OperatorProcess

        self.box, self.namespaces, self.workdir, self.kueue = box, list(namespaces), workdir, kueue
        self.node_count = len(box.nodes)
        self.node_hits: Counter[str] = Counter()
        """Per job: the node cuts of other runs that found a live rank of it on the node."""
        self._node_down = threading.Lock()
        self._back: threading.Thread | None = None
        self.free: queue.Queue[str] = queue.Queue()
        for namespace in namespaces:
            self.free.put(namespace)
        self.api = config.new_client_from_config(config_file=str(box.plane.kubeconfig))
        self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        self._operator_cls = OperatorProcess
        self.operator_logs: list[Path] = []
        self._swap = threading.Lock()
        self.armed = ""
        """The fault point the running operator exits at, if any."""
        self.fired: list[str] = []
        """The armed points the operator exited at."""
        self.exits: list[str] = []
        """The operator's exits that no fault asked for: each fails the runs alive then."""
        self.operator = self._start_operator()
        self._calm = threading.Lock()
        self.whole_since = time.monotonic()
        """When the last box fault ended: the control plane has been whole since then."""
        self.nodes_whole_since = 0.0
        """When the last cut node came back (``math.inf`` while one is cut): a pod deleted on a cut node goes only
        once its kubelet is back to confirm it, as on any cluster."""
        self._closing = threading.Event()
        self._keeper = threading.Thread(target=self._keep, daemon=True, name="chaos-operator-keeper")
        self._keeper.start()

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A call to the apiserver, made while no box fault is under way (another run's, with --parallel);
        a 5xx (etcd just restarted: the apiserver answers, but writes may fail for a moment) is tried again."""
        deadline = time.monotonic() + 60
        while True:
            with self._calm:
                try:
                    return method(*args, **kwargs)
                except Exception as err:
                    if int(getattr(err, "status", 0) or 0) < 500 or time.monotonic() > deadline:
                        raise
            time.sleep(1)

    def create_job(self, job: JobRef, body: dict[str, Any]) -> None:
        self.call(self.custom.create_namespaced_custom_object, GROUP, VERSION, job.namespace, PLURAL, body)

    def patch_job(self, job: JobRef, patch: dict[str, Any]) -> None:
        self.call(self.custom.patch_namespaced_custom_object, GROUP, VERSION, job.namespace, PLURAL, job.name, patch)

    def delete_job(self, job: JobRef) -> None:
        self.call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, job.namespace, PLURAL, job.name)

    def delete_claim(self, job: JobRef) -> None:
        self.call(self.core.delete_namespaced_persistent_volume_claim, job.claim, job.namespace)

    def create_namespace(self, namespace: str) -> None:
        """The namespace, once pods can be made in it (the controller-manager has made its default
        ServiceAccount)."""
        self.call(self.core.create_namespace, {"metadata": {"name": namespace}})
        if self.kueue:  # its own ClusterQueue of 2 slots, so a preemption in it evicts only its run's job
            self._make_queues(namespace)
        accounts = self.core.list_namespaced_service_account
        wait(
            f"namespace {namespace}'s default ServiceAccount",
            lambda: self.call(accounts, namespace, field_selector="metadata.name=default").items,
            120,
        )

    def _make_queues(self, namespace: str) -> None:
        from kubernetes.client.rest import ApiException

        for plural, body in kueue_queues(namespace):
            try:
                if plural == "localqueues":
                    self.call(self.custom.create_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2", namespace,
                              plural, body)  # fmt: skip
                else:
                    self.call(self.custom.create_cluster_custom_object, "kueue.x-k8s.io", "v1beta2", plural, body)
            except ApiException as err:
                if err.status != 409:  # made for an earlier namespace
                    raise

    def namespace_gone(self, namespace: str) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self.call(self.core.read_namespace, namespace)
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        return False

    @contextmanager
    def namespace_for_a_run(self) -> Iterator[str]:
        """A namespace no other run uses meanwhile; made again after, when the run deleted it. One still
        terminating after its run is not handed out again (that run says why)."""
        namespace = wait("a namespace free for the run", self._take, 900)
        try:
            yield namespace
        finally:
            try:
                if self.namespace_gone(namespace):
                    self.create_namespace(namespace)
                if not self.call(self.core.read_namespace, namespace).metadata.deletion_timestamp:
                    self.free.put(namespace)
            except Exception as err:  # the soak goes on with one namespace fewer, and says so
                log(f"namespace {namespace} is not handed out again: {type(err).__name__}: {err}")

    def _take(self) -> str:
        try:
            return self.free.get(timeout=1)
        except queue.Empty:
            return ""

    def box_fault(self, fault: Callable[[], None]) -> None:
        """Runs a fault on the box alone, and returns once the apiserver answers from etcd again."""
        with self._calm:
            fault()
            wait("the apiserver to answer after the fault", self._answers, 120)
            self.whole_since = time.monotonic()

    def _answers(self) -> bool:
        try:
            self.core.list_namespace(limit=1)
        except Exception:  # still restarting
            return False
        return True

    def _start_operator(self, armed: str = "") -> Any:
        path = self.workdir / f"operator-{len(self.operator_logs)}.log"
        self.operator_logs.append(path)
        return self._operator_cls(self.box.plane.kubeconfig, path, namespaces=self.namespaces, faults=armed)

    def operator_log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.operator_logs if p.exists())

    def kill_operator(self, armed: str = "") -> None:
        """SIGKILL, then another operator at once; ``armed``: a fault point it exits at (OPERATOR_POINTS)."""
        with self._swap:
            self.operator.proc.kill()
            self.operator.proc.wait()
            self.armed = armed
            self.operator = self._start_operator(armed)

    def _keep(self) -> None:
        """Starts a plain operator when the running one exits on its own: at its armed point (counted in
        ``fired``), or not (a crash, kept in ``exits``)."""
        while not self._closing.wait(0.5):
            with self._swap:
                code = self.operator.proc.poll()
                if code is None:
                    continue
                if self.armed and code == operator_faults.EXIT_CODE:
                    self.fired.append(self.armed)
                else:
                    self.exits.append(f"the operator exited on its own with code {code}")
                self.armed = ""
                self.operator = self._start_operator()

    def component(self, name: str) -> Any:
        return next(c for c in self.box.plane.components if c.name == name)

    def restart(self, component: Any, pause: float = 1.0) -> None:
        component.stop()
        time.sleep(pause)
        component.start()

    def restart_kubelet(self) -> None:
        """The first node's kubelet restarted; not while a node is down (a power cut stops that kubelet itself)."""
        if not self._node_down.acquire(blocking=False):
            raise NotInjected("a node is down")
        try:
            self.box_fault(lambda: self.restart(self.box.node.kubelet))
        finally:
            self._node_down.release()

    def claim(self, job: JobRef) -> dict[str, Any]:
        """The run's checkpoints' claim: on one node, the box's default class; on several, one that every node mounts
        (ReadWriteMany), as a gang spread over nodes needs."""
        spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        if self.node_count > 1:
            spec |= {"accessModes": ["ReadWriteMany"], "storageClassName": SHARED_STORAGE_CLASS}
        return {"metadata": {"name": job.claim}, "spec": spec}

    def rank_pod(self, job: JobRef, pod: str) -> Any:
        """The rank's pod as the apiserver has it; ``NotInjected`` when it is gone (the job is restarting)."""
        from kubernetes.client.rest import ApiException

        try:
            return self.call(self.core.read_namespaced_pod, pod, job.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            raise NotInjected(f"{pod} is gone (the job is restarting)") from None

    def cut_node(self, job: JobRef, pod: str, fault: str, back_after: float) -> str:
        """The power or the network of the node that runs ``pod`` cut; a thread brings it back once the job runs
        again in a later attempt (or after NODE_DOWN_SECONDS), ``back_after`` seconds later. Every other job with a
        live rank there is counted as hit."""
        body = self.rank_pod(job, pod)
        if not body.spec.node_name:
            raise NotInjected(f"{pod} is not on a node yet")
        if not self._node_down.acquire(blocking=False):
            raise NotInjected("another node is down")
        node = self.box.node_named(body.spec.node_name)
        attempt = int((status_now(self, job).get("attempt")) or 0)
        try:
            on_it = self.call(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node.name}")
            for other in on_it.items:
                name = (other.metadata.labels or {}).get("ddpjob.dev/job-name")
                if name and name != job.name and not other.metadata.deletion_timestamp:
                    self.node_hits[name] += 1
            self.nodes_whole_since = math.inf
            cut_node(self.core, node, fault.removesuffix("-cut"))
        except BaseException:
            self.nodes_whole_since = time.monotonic()
            self._node_down.release()
            raise
        self._back = threading.Thread(target=self._bring_back, args=(node, fault, job, attempt, back_after),
                                      daemon=True, name="chaos-node-back")  # fmt: skip
        self._back.start()
        return f"of {node.name}"

    def _bring_back(self, node: Any, fault: str, job: JobRef, attempt: int, back_after: float) -> None:
        try:
            self._wait_for_the_next_attempt(job, attempt)
            self._closing.wait(back_after)
            bring_back_node(self.core, node, fault.removesuffix("-cut"))
            log(f"{node.name} back after its {fault}")
            self.nodes_whole_since = time.monotonic()
        except Exception as err:  # the run that waits on the job says what went wrong; this says why the node did not
            log(f"{node.name} was not brought back after its {fault}: {type(err).__name__}: {err}")
        finally:
            self._node_down.release()

    def _wait_for_the_next_attempt(self, job: JobRef, attempt: int) -> None:
        """Until the job runs in a later attempt, ends, or is gone; NODE_DOWN_SECONDS at most."""
        deadline = time.monotonic() + NODE_DOWN_SECONDS
        while time.monotonic() < deadline and not self._closing.is_set():
            try:
                now = status_now(self, job)
            except Exception:  # gone (deleted with its namespace), or the box does not answer: the node comes back
                return
            again = int(now.get("attempt") or 0) > attempt and now.get("phase") == "Running"
            if again or now.get("phase") in ("Succeeded", "Failed"):
                return
            time.sleep(1)

    def restart_kueue(self) -> None:
        """Kueue's manager killed (its pod deleted at once), and ready again: webhooks and visibility API."""
        self.box.kueue.kill()
        self.box.kueue.wait_ready()

    def close(self) -> None:
        self._closing.set()
        if self._back is not None:
            self._back.join()
        self._keeper.join()
        self.operator.stop()
        self.api.close()


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


def status(stack: Stack, job: JobRef) -> dict[str, Any]:
    """The job's status, or {} while the apiserver does not answer: for polls."""
    try:
        body = stack.custom.get_namespaced_custom_object(GROUP, VERSION, job.namespace, PLURAL, job.name)
    except Exception:  # the apiserver may be restarting
        return {}
    return dict(body.get("status") or {})


def status_now(stack: Stack, job: JobRef) -> dict[str, Any]:
    """The job's status as the apiserver has it once it answers (another run's box fault may be under way)."""
    get = stack.custom.get_namespaced_custom_object
    deadline = time.monotonic() + 120
    while True:
        try:
            return dict(stack.call(get, GROUP, VERSION, job.namespace, PLURAL, job.name).get("status") or {})
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


SUSPENDED_OR_OVER = ("Suspended", "Succeeded", "Failed")
LIVE_OR_OVER = ("Running", "Succeeded", "Failed")
"""The phases a fault waits for: Running, or an end that leaves nothing to inject."""


def wait(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    return wait_until(what, probe, lambda: deadline)


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


def restarted_or_over(stack: Stack, job: JobRef, attempt: int) -> Callable[[], dict[str, Any]]:
    """The status once the job has restarted past ``attempt`` or ended; {} before."""

    def probe() -> dict[str, Any]:
        found = status(stack, job)
        over = found.get("phase") in ("Succeeded", "Failed")
        return found if over or int(found.get("attempt", 0)) > attempt else {}

    return probe


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


class NotInjected(Exception):
    """The fault found nothing to act on (the rank's process had just gone): the run goes on without it."""


def trainer_pid(stack: Stack, job: JobRef, pod: str, *, training: bool = True) -> int:
    """The host PID of the rank's training process (``training``: the child its supervisor restarts in place, where
    there is one), or of its trainer container's first process."""
    from ddpjob_box.errors import BoxError

    deadline = time.monotonic() + 15
    while True:
        found = stack.rank_pod(job, pod)
        running = [s for s in found.status.container_statuses or [] if s.name == "trainer" and s.state.running]
        try:
            if running:
                node = stack.box.node_named(found.spec.node_name) if stack.node_count > 1 else stack.box.node
                pid = node.training_pid if training else node.container_pid
                return int(pid(running[0].container_id))
        except BoxError as err:
            if time.monotonic() > deadline:
                raise NotInjected(str(err)) from None
        if time.monotonic() > deadline:
            raise NotInjected(f"{pod}'s trainer is not running")
        time.sleep(0.5)


class Broken(Exception):
    """The fault found a promise broken on the spot: a violation, and the run goes on."""


def inject(stack: Stack, job: JobRef, fault: str, rng: random.Random) -> str:
    """Injects ``fault``; returns what the timeline should add to its name ("" for nothing)."""
    from kubernetes.client.rest import ApiException

    rank = rng.randrange(2)
    pod = f"{job.name}-{rank}"
    match fault:
        case "kill-rank":
            # Half the time the training process (its supervisor restarts the gang's in place), half the container's
            # first process (the container ends: its kubelet restarts it in place, or the operator makes it again).
            os.kill(trainer_pid(stack, job, pod, training=rng.random() < 0.5), signal.SIGKILL)
        case "hang-rank":
            os.kill(trainer_pid(stack, job, pod), signal.SIGSTOP)
        case "delete-pod":
            try:
                stack.call(stack.core.delete_namespaced_pod, pod, job.namespace)
            except ApiException as err:
                if err.status != 404:
                    raise
                raise NotInjected(f"{pod} is gone (the job is restarting)") from None
        case "kill-operator":
            stack.box_fault(stack.kill_operator)
        case "kill-operator-at-point":
            point = rng.choice(OPERATOR_POINTS)
            stack.box_fault(lambda: stack.kill_operator(armed=point))
            return f"armed at {point}"
        case "restart-kubelet":
            stack.restart_kubelet()
        case "restart-apiserver":
            stack.box_fault(lambda: stack.restart(stack.component("kube-apiserver"), pause=2.0))
        case "restart-etcd":
            stack.box_fault(lambda: stack.restart(stack.component("etcd"), pause=2.0))
        case "suspend-resume":
            patch = {"spec": {"runPolicy": {"suspend": True}}}
            stack.patch_job(job, patch)
            phase = wait("Suspended", lambda: (p := status(stack, job).get("phase")) in SUSPENDED_OR_OVER and p, 60)
            patch["spec"]["runPolicy"]["suspend"] = False
            stack.patch_job(job, patch)
            if phase != "Suspended":  # every rank had exited 0 before the operator saw the suspend
                raise NotInjected(f"the job {phase} before the suspend took")
        case "spec-edit":
            # What may change while it runs does, and costs no restart; the pod template may not (CEL).
            stack.patch_job(
                job, {"spec": {"progressDeadlineSeconds": 25, "runPolicy": {"ttlSecondsAfterFinished": 3600}}}
            )
            try:
                stack.patch_job(job, {"spec": {"template": {"metadata": {"labels": {"chaos-edit": "yes"}}}}})
            except ApiException as err:
                if err.status != 422 or "spec.template cannot change" not in str(err.body):
                    raise Broken(
                        f"a template edit while running was refused otherwise: {err.status} {err.body}"
                    ) from None
            else:
                raise Broken("a template edit while running was accepted")
        case "preempt":
            preempt(stack, job)
        case "restart-kueue":
            stack.box_fault(stack.restart_kueue)
        case "power-cut" | "network-cut":
            return stack.cut_node(job, pod, fault, back_after=rng.uniform(0.0, 20.0))
        case "delete-job":
            stack.delete_job(job)
        case "delete-namespace":
            stack.call(stack.core.delete_namespace, job.namespace)
    return ""


def kueue_queues(namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(plural, body): a ClusterQueue of 2 slots for this namespace alone, its LocalQueue (namespaced), and what
    they share (a flavor, the two priorities: made once, 409 after)."""
    api = "kueue.x-k8s.io/v1beta2"
    quota = [{"name": "cpu", "nominalQuota": 8}, {"name": "memory", "nominalQuota": "16Gi"},
             {"name": SLOT, "nominalQuota": 2}]  # fmt: skip
    cluster_queue = {
        "apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": f"cq-{namespace}"},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", SLOT],
                                     "flavors": [{"name": "chaos-flavor", "resources": quota}]}]},
    }  # fmt: skip
    return [
        ("resourceflavors", {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": "chaos-flavor"}}),
        ("workloadpriorityclasses", {"apiVersion": api, "kind": "WorkloadPriorityClass", "metadata": {"name": LOW},
                                     "value": 100}),
        ("workloadpriorityclasses", {"apiVersion": api, "kind": "WorkloadPriorityClass", "metadata": {"name": HIGH},
                                     "value": 10000}),
        ("clusterqueues", cluster_queue),
        ("localqueues", {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": namespace},
                         "spec": {"clusterQueue": f"cq-{namespace}"}}),
    ]  # fmt: skip


def preempt(stack: Stack, job: JobRef) -> None:
    """A high-priority job that needs the run's 2 slots: Kueue must evict the run's job (Queued, EvictedByKueue,
    its pods gone), and admit it again once the preemptor has Succeeded."""
    name = f"{job.name}-hi"
    body = chaos_job(name, job.claim, 0, kueue=True)
    body["metadata"]["labels"][LABEL_PRIORITY_CLASS] = HIGH
    del body["spec"]["checkpoint"]
    trainer_args = body["spec"]["template"]["spec"]["containers"][0]["args"]
    trainer_args[trainer_args.index("--steps") + 1] = "10"
    stack.create_job(JobRef(job.namespace, name, job.claim), body)
    preemptor = JobRef(job.namespace, name, job.claim)
    try:

        def evicted() -> str:
            found = status(stack, job)
            said: dict[str, Any] = next((c for c in found.get("conditions") or [] if c.get("type") == "Queued"), {})
            over = found.get("phase") in ("Succeeded", "Failed")
            return "over" if over else ("evicted" if said.get("reason") == Reason.EVICTED else "")

        if wait("the run's job evicted by Kueue", evicted, PREEMPT_SECONDS) == "over":
            raise NotInjected("the job ended before Kueue evicted it")
        wait("the preemptor to succeed", lambda: status(stack, preemptor).get("phase") == "Succeeded", 300)
    finally:
        stack.delete_job(preemptor)


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


def names(seed: int, index: int, namespace: str) -> JobRef:
    """A run's DDPJob and its checkpoints' PVC, in the namespace it was given."""
    return JobRef(namespace, f"chaos-{seed}-{index}", f"ckpt-{seed}-{index}")


def drawn(seed: int, index: int, *, kueue: bool = False, nodes: int = 1) -> tuple[random.Random, list[str]]:
    """A run's faults, in the order it injects them (a deletion last: it ends the run), and the generator
    that goes on to draw their timing; ``kueue`` adds KUEUE_FAULTS to those drawn from, several ``nodes``
    NODE_FAULTS."""
    rng = random.Random(f"{seed}:{index}")
    kinds = (*FAULTS, *(KUEUE_FAULTS if kueue else ()), *(NODE_FAULTS if nodes > 1 else ()))
    faults = rng.sample(kinds, rng.randint(1, 3))
    return rng, sorted(faults, key=lambda fault: fault in ENDING)


def one_run(stack: Stack, seed: int, index: int, namespace: str) -> Run:
    rng, faults = drawn(seed, index, kueue=stack.kueue, nodes=stack.node_count)
    result = Run(seed, index, faults, backoff_limit=backoff_limit(index))
    job = names(seed, index, namespace)
    started = time.monotonic()
    logged = len(stack.operator_log())  # what earlier runs left in the operator's log is theirs
    exits = len(stack.exits)
    deleted = ""
    """The fault that deleted the job or its namespace, once injected."""

    def said(what: str) -> None:
        result.timeline.append(f"{time.monotonic() - started:6.1f}s {what}")

    stack.call(stack.core.create_namespaced_persistent_volume_claim, job.namespace, stack.claim(job))
    stack.create_job(job, chaos_job(job.name, job.claim, result.backoff_limit, kueue=stack.kueue))
    watchdog = Watchdog(stack, job)
    try:
        for fault in faults:
            if deleted:
                result.skipped.append(fault)
                said(f"skipped {fault}: {deleted} came before it")
                continue
            # A restarted gang that resumes near the end can finish from Rendezvous, never Running again.
            attempt = wait("the job to run", lambda: (s := status(stack, job)).get("phase") in LIVE_OR_OVER and s, 300)
            pause = rng.uniform(1.0, 6.0)  # drawn either way: a replay draws the same numbers
            if attempt["phase"] == "Running":
                time.sleep(pause)
            if status_now(stack, job).get("phase") != "Running":
                result.skipped.append(fault)
                said(f"skipped {fault}: the job left Running before it")  # it finished
                continue
            try:
                note = inject(stack, job, fault, rng)
            except NotInjected as err:
                result.skipped.append(fault)
                said(f"skipped {fault}: {err}")
                continue
            except Broken as err:
                result.violations.append(str(err))
                note = "broke a promise"
            said(f"{fault}{f' {note}' if note else ''} (attempt {attempt['attempt']})")
            if fault in ENDING:
                deleted = fault
            elif fault in (*RESTARTING, *NODE_FAULTS):
                after = wait("the restart", restarted_or_over(stack, job, int(attempt["attempt"])), 120)
                same = int(after.get("attempt", 0)) == int(attempt["attempt"])
                late = too_late(fault, after) if same and after.get("phase") == "Succeeded" else ""
                if late:
                    result.skipped.append(fault)
                    said(f"{fault} came too late: {late}")
        if deleted:
            result.outcome = "job deleted" if deleted == "delete-job" else "namespace deleted"
        else:
            over = ("Succeeded", "Failed")
            final = wait(
                "the job to end", lambda: (s := status(stack, job)).get("phase") in over and s, 300 + 60 * len(faults)
            )
            said(f"{final['phase']}")
            result.outcome, result.restarts = final["phase"], int(final.get("restarts", -1))
            result.step = int((final.get("progress") or {}).get("step") or -1)
            ended = [c for c in final.get("conditions") or [] if c.get("type") == final["phase"]]
            result.reason = str(ended[0].get("reason", "")) if ended else ""
    except TimeoutError as err:
        result.outcome = "timeout"
        result.violations.append(str(err))
    finally:
        result.violations += watchdog.stop()
    events = stack.call(
        stack.core.list_namespaced_event, job.namespace, field_selector=f"involvedObject.name={job.name}"
    )
    result.events = [f"{e.reason}: {e.message}" for e in events.items]
    result.node_hits = stack.node_hits.pop(job.name, 0)
    result.violations += ended_as_promised(stack, job, result, deleted)
    result.violations += stack.exits[exits:]
    operator_log = stack.operator_log()[logged:]
    if "Traceback" in operator_log:
        result.violations.append("the operator logged a traceback")
    if result.violations:
        result.operator_log = log_excerpt(operator_log, job.name)
        result.removals = audit.removals(stack.box.plane.audit_log, job.namespace, job.name)
    result.seconds = round(time.monotonic() - started, 1)
    return result


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


def log_excerpt(log_text: str, name: str, lines: int = 200, tail: int = 3000) -> str:
    """What a violation keeps of the operator's log: the lines that name this job (its whole story, which
    the other runs' lines would push out of a plain tail), then the tail, for what happened around the end."""
    mine = re.compile(re.escape(name) + r"\b")
    said = [line for line in log_text.splitlines() if mine.search(line)]
    return "\n".join(said[-lines:]) + "\n--- the log's tail ---\n" + log_text[-tail:]


@contextmanager
def chaos_stack(parallel: int, kueue: bool = False, nodes: int = 1) -> Iterator[Stack]:
    """A box with its ``nodes`` (the controller-manager's NODE_GRACE with several) and the trainer image, the CRD, a
    namespace per run going on at once, and the operator, watching those namespaces (the chart's namespaced
    mode)."""
    from bench.apiserver import Api
    from bench.operator_scale import apply_crd
    from ddpjob_box.box import Box

    with (
        tempfile.TemporaryDirectory(prefix="ddpjob-chaos-") as tmp,
        Box(
            Path(tmp) / "box",
            with_prometheus=False,
            with_kueue=kueue,
            node_count=nodes,
            controller_manager_args=list(NODE_GRACE) if nodes > 1 else [],
        ) as box,
    ):
        plane = box.plane
        assert plane is not None
        apply_crd(Api(plane.server, plane.admin_token, str(plane.ca_file)))
        namespaces = [f"chaos-ns-{i}" for i in range(parallel)]
        stack = Stack(box, namespaces, Path(tmp), kueue=kueue)
        try:
            for namespace in namespaces:
                stack.create_namespace(namespace)
            yield stack
        finally:
            stack.close()


class Overlaps:
    """Which runs went on at some moment of each run (with --parallel), for the replay command."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._alive: dict[int, set[int]] = {}
        self.seen: dict[int, set[int]] = {}

    @contextmanager
    def running(self, run: int) -> Iterator[None]:
        with self._lock:
            for other, seen in self._alive.items():
                seen.add(run)
                self.seen.setdefault(run, set()).add(other)
            self._alive[run] = self.seen.setdefault(run, set())
        try:
            yield
        finally:
            with self._lock:
                del self._alive[run]


def guarded_run(stack: Stack, seed: int, index: int, overlaps: Overlaps) -> Run:
    """One run; a failure of the harness itself is kept as that run's violation, and the soak goes on."""
    with overlaps.running(index), stack.namespace_for_a_run() as namespace:
        try:
            result = one_run(stack, seed, index, namespace)
        except Exception as err:  # kept in the results, with the replay command
            failed = f"the harness failed: {type(err).__name__}: {err}"
            result = Run(seed, index, [], outcome="harness-error", violations=[failed])
            job = names(seed, index, namespace)
            for delete in (stack.delete_job, stack.delete_claim):
                try:
                    delete(job)
                except Exception:  # best effort: the box goes when the soak ends
                    pass
    result.alongside = sorted(overlaps.seen.get(index, set()))
    return result


def soak(stack: Stack, seed: int, runs: Sequence[int], out: Path, parallel: int = 1) -> list[Run]:
    """The runs, ``parallel`` at a time; each is logged and written to ``out`` as it ends."""
    results = []
    out.parent.mkdir(parents=True, exist_ok=True)
    overlaps = Overlaps()
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="chaos-run")
    try:
        futures = [pool.submit(guarded_run, stack, seed, index, overlaps) for index in runs]
        for future in as_completed(futures):
            result = future.result()
            verdict = "ok" if not result.violations else f"VIOLATION {result.violations}; replay: {result.replay}"
            log(f"run {seed}:{result.run} {result.faults} -> {result.outcome}, restarts {result.restarts}, "
                f"{result.seconds}s: {verdict}")  # fmt: skip
            with out.open("a") as f:
                f.write(json.dumps(asdict(result)) + "\n")
            results.append(result)
    except BaseException:
        STOPPING.set()  # on Ctrl-C the runs under way stop waiting, and no new one starts
        raise
    finally:
        pool.shutdown(cancel_futures=True)
    return sorted(results, key=lambda r: r.run)


def summary(
    results: Sequence[Run], parallel: int, wall_seconds: float, restarted: Sequence[str] = (), fired: Sequence[str] = ()
) -> str:
    """The faults by kind, then the totals; ``restarted``: the box's components that exited on their own;
    ``fired``: the points the armed operator exited at."""
    drawn = Counter(f for r in results for f in r.faults)
    skipped = Counter(f for r in results for f in r.skipped)
    kinds = (*FAULTS, *(k for k in (*KUEUE_FAULTS, *NODE_FAULTS) if drawn[k]))
    rows = [[kind, drawn[kind] - skipped[kind], skipped[kind]] for kind in kinds]
    head = table(["fault", "injected", "skipped or too late (the job or the rank had ended)"], rows)
    total = [[len(results), parallel, sum(bool(r.violations) for r in results),
              sum(r.outcome == "Succeeded" for r in results), sum(r.restarts for r in results if r.restarts > 0),
              f"{wall_seconds / 60:.1f} min"]]  # fmt: skip
    heads = ["runs", "at once", "with a violation", "succeeded", "restarts", "time"]
    said = [(line.split(" exited", 1)[0], LAST_ERROR_SAID.search(line)) for line in restarted]
    exits = Counter(name for name, _ in said)
    tail = ", ".join(f"{name} {count}" for name, count in sorted(exits.items())) or "none"
    causes = Counter((name, found.group(1)) for name, found in said if found)
    points = ", ".join(f"{point} {count}" for point, count in sorted(Counter(fired).items())) or "none"
    why = "".join(f'\n- {name}, {count} times: "{error}"' for (name, error), count in sorted(causes.items()))
    return (
        head
        + "\n\n"
        + table(heads, total)
        + f"\n\nBox components that exited and were started again: {tail}."
        + (f"\nTheir last error before they exited:{why}" if why else "")
        + f"\n\nThe armed operator exited at its point {len(fired)} times ({points})."
    )


def main(argv: Sequence[str] | None = None) -> None:
    need_trainer("python -m bench.chaos")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=1, help="runs going on at once, each with its own job")
    parser.add_argument("--replay", help="SEED:RUN[,SEED:RUN...]: those runs alone, side by side")
    parser.add_argument("--kueue", action="store_true", help="Kueue in the box, every job queued, and its faults")
    parser.add_argument("--nodes", type=int, default=1, help="real nodes in the box; more than 1 adds NODE_FAULTS")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    seed, runs, parallel = args.seed, list(range(args.runs)), args.parallel
    if args.replay:
        pairs = [tuple(int(x) for x in item.split(":")) for item in args.replay.split(",")]
        if len({s for s, _ in pairs}) != 1:
            parser.error(f"--replay {args.replay}: the runs must share one seed")
        seed, runs, parallel = pairs[0][0], [run for _, run in pairs], len(pairs)
    started = time.monotonic()
    with chaos_stack(parallel, kueue=args.kueue, nodes=args.nodes) as stack:
        results = soak(stack, seed, runs, RESULTS_DIR / f"{NAME}.jsonl", parallel)
        assert stack.box.plane is not None
        restarted, fired = list(stack.box.plane.restarted), list(stack.fired)
    markdown = summary(results, parallel, time.monotonic() - started, restarted, fired)
    print(markdown)
    data = {"machine": machine(), "seed": seed, "parallel": parallel, "box_restarted": restarted, "fired": fired}
    write_results(NAME, {**data, "runs": [asdict(r) for r in results]}, markdown)
    if any(r.violations for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
