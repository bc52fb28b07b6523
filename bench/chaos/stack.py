"""The box as the chaos runs see it: ``Stack`` (the parts a fault acts on, the namespaces the runs take turns in,
and the operator, which it keeps running), ``chaos_stack`` (the box made for a soak), the job's status as the runs
poll it, and the waits on it. The stack's own fault actions (a rank's pod looked up, a node cut, kubelet restarted
while a node is down) raise ``NotInjected`` when they find nothing to act on."""

from __future__ import annotations

import math
import queue
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.chaos.job import GROUP, PLURAL, VERSION, JobRef, kueue_queues
from bench.common import log, wait_until
from bench.node_loss import bring_back_node, cut_node
from ddpjob_box.provisioner import SHARED_STORAGE_CLASS
from ddpjob_box.topology import LABEL_PREFIX, TOPOLOGY_NAME
from ddpjob_contract import faults as operator_faults

NODE_DOWN_SECONDS = 120
"""The longest a cut node stays down."""
LEASE = "ddpjob-operator"
LEASE_NAMESPACE = "default"
ELECTION = {"lease-duration": 15.0, "renew-deadline": 10.0, "retry-period": 2.0}
"""With two replicas (``--replicas 2``): leader election on a Lease, with the chart's durations."""
FENCED = "could not renew the leader Lease"
"""What a leader cut off from the apiserver logs as it stops writing and exits, to start again as a standby."""
NODE_GRACE = ("--node-monitor-grace-period=10s", "--node-monitor-period=2s")
"""The controller-manager's, with several nodes (as bench.node_loss, and as kind or kubeadm users shorten it)."""


class NotInjected(Exception):
    """The fault found nothing to act on (the rank's process had just gone): the run goes on without it."""


class Stack:
    """The box's parts a fault acts on, the namespaces the runs take turns in, and the operator, which a fault
    may kill or arm and which this keeps running."""

    def __init__(
        self, box: Any, namespaces: Sequence[str], workdir: Path, *, kueue: bool = False, replicas: int = 1
    ) -> None:
        # With Kueue on a box with a topology, every other namespace's jobs are placed by it (a rack each)
        self.rack = f"{LABEL_PREFIX}{box.topology[-1].name}" if kueue and box.topology else ""
        # With Kueue on several nodes, ranks keep off the node that runs Kueue's manager, which no node fault cuts
        self.avoid = box.node.name if kueue and len(box.nodes) > 1 else ""
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
        self.replicas = replicas
        self.fenced: list[str] = []
        """The replicas that stopped leading when cut off from the apiserver, and exited, as they must."""
        self._links: dict[int, Any] = {}
        """With two replicas: each slot's own way to the apiserver, which ``cut_leader`` stops, and its port."""
        self._link_ports: dict[int, int] = {}
        self._cut = ""
        """The replica ``cut_leader`` cut last."""
        self._identities = iter(range(1_000_000))
        self.identities = [""] * replicas
        """Each slot's replica's name (its Lease holder identity), with two replicas."""
        self.operators = [self._start_operator(slot=slot) for slot in range(replicas)]
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

        for plural, body in kueue_queues(namespace, TOPOLOGY_NAME if self.rack_of(namespace) else "chaos-flavor"):
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

    @property
    def operator(self) -> Any:
        """The operator the operator faults act on: the first slot's (with two replicas, either role)."""
        return self.operators[0]

    def _start_operator(self, armed: str = "", slot: int = 0) -> Any:
        path = self.workdir / f"operator-{len(self.operator_logs)}.log"
        self.operator_logs.append(path)
        if self.replicas == 1:
            return self._operator_cls(self.box.plane.kubeconfig, path, namespaces=self.namespaces, faults=armed)
        identity = f"replica-{next(self._identities)}"
        flags = ["--leader-elect", f"--leader-elect-identity={identity}", f"--leader-elect-lease={LEASE}",
                 f"--leader-elect-namespace={LEASE_NAMESPACE}",
                 *(f"--leader-elect-{k}={v:g}" for k, v in ELECTION.items())]  # fmt: skip
        process = self._operator_cls(self._linked_kubeconfig(slot), path, namespaces=self.namespaces, faults=armed,
                                     extra_args=flags)  # fmt: skip
        self.identities[slot] = identity
        return process

    def _linked_kubeconfig(self, slot: int) -> Path:
        """The admin kubeconfig, through a forwarder of the slot's own that ``cut_leader`` can stop (as a node's
        kubelet link: its requests then hang, as across a cut cable)."""
        import yaml

        from ddpjob_box.kubenode.node import start_link

        link = self._links.get(slot)
        if link is None or not link.alive():
            log_path = self.workdir / f"operator-link-{slot}.log"
            self._links[slot], self._link_ports[slot] = start_link(
                "operator-link", "the operator's", self.box.plane.apiserver_port, log_path
            )
        config = yaml.safe_load(self.box.plane.kubeconfig.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self._link_ports[slot]}"
        path = self.workdir / f"operator-{slot}.kubeconfig"
        path.touch(mode=0o600)  # it holds the admin's credentials
        path.write_text(yaml.safe_dump(config))
        return path

    def log_marks(self) -> dict[Path, int]:
        """How long each operator log is now, for ``operator_log_since``."""
        return {p: p.stat().st_size for p in self.operator_logs if p.exists()}

    def operator_log_since(self, marks: dict[Path, int]) -> str:
        """What the operators logged since ``marks`` (two replicas write side by side)."""
        said = []
        for path in self.operator_logs:
            if path.exists():
                with path.open("rb") as log_file:
                    log_file.seek(marks.get(path, 0))
                    said.append(log_file.read().decode(errors="replace"))
        return "".join(said)

    def kill_operator(self, armed: str = "") -> None:
        """SIGKILL, then another operator at once; ``armed``: a fault point it exits at (OPERATOR_POINTS)."""
        with self._swap:
            self.operator.proc.kill()
            self.operator.proc.wait()
            self.armed = armed
            self.operators[0] = self._start_operator(armed)

    def leader(self) -> tuple[int, str]:
        """The slot and name of the replica that holds the Lease (waits up to 60 s for one to)."""
        from kubernetes import client

        leases = client.CoordinationV1Api(self.api)

        def held() -> tuple[int, str] | None:
            try:  # not through ``call``: the leader faults run under ``box_fault``, which holds its lock
                holder = leases.read_namespaced_lease(LEASE, LEASE_NAMESPACE).spec.holder_identity
            except Exception:
                return None
            slots = range(len(self.operators))
            found = (s for s in slots if self.identities[s] == holder and self.operators[s].alive())
            return next(((s, str(holder)) for s in found), None)

        slot, name = wait("a replica to hold the Lease", held, 60)
        return int(slot), str(name)

    def _leading(self) -> int:
        """The leader's slot, taken with ``_swap`` held: the keeper cannot swap it meanwhile (the caller releases)."""
        while True:
            slot, name = self.leader()
            self._swap.acquire()
            if self.identities[slot] == name:
                return slot
            self._swap.release()  # the keeper replaced it between the look and the lock: look again

    def kill_leader(self) -> str:
        """SIGKILL the replica that leads, and start another in its place, as the next standby; returns its name."""
        slot = self._leading()
        try:
            killed, name = self.operators[slot], self.identities[slot]
            killed.proc.kill()
            killed.proc.wait()
            if slot == 0:
                self.armed = ""
            self.operators[slot] = self._start_operator(slot=slot)
        finally:
            self._swap.release()
        return name

    def cut_leader(self, seconds: float) -> tuple[str, bool]:
        """The leader's way to the apiserver cut for ``seconds`` (past its lease), then back: it must stop leading
        at its renew deadline and exit, and the standby take over; the keeper starts it again as a standby.
        Returns the cut replica's name, and whether it exited (within 30 s of the link's return)."""
        import os
        import signal

        slot = self._leading()
        try:
            cut, link, name = self.operators[slot], self._links[slot], self.identities[slot]
            self._cut = name
        finally:
            self._swap.release()
        os.kill(link.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(link.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while cut.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        return name, cut.proc.poll() is not None

    def _keep(self) -> None:
        """Starts a plain operator when a running one exits on its own: at its armed point (counted in ``fired``),
        a leader fenced off the apiserver (in ``fenced``, with why: its cut, a box fault, or neither), or not (a
        crash, kept in ``exits``). A start that fails is kept in ``exits`` too, and tried again."""
        while not self._closing.wait(0.5):
            with self._swap:
                for slot, process in enumerate(self.operators):
                    code = process.proc.poll()
                    if code is None:
                        continue
                    name = self.identities[slot]
                    if slot == 0 and self.armed and code == operator_faults.EXIT_CODE:
                        self.fired.append(self.armed)
                    elif self.replicas > 1 and FENCED in process.log():
                        why = "cut" if name == self._cut else "box fault" if self._calm.locked() else "no fault"
                        self.fenced.append(f"{name} ({why})")
                    else:
                        self.exits.append(f"the operator exited on its own with code {code}")
                    if slot == 0:
                        self.armed = ""
                    try:
                        self.operators[slot] = self._start_operator(slot=slot)
                    except Exception as err:  # its link did not start: said, and tried again at the next look
                        self.exits.append(f"the operator could not be started again: {err}")

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

    def rack_of(self, namespace: str) -> str:
        """The node label a namespace's jobs are placed in one domain of (Kueue's topology); empty: none."""
        index = self.namespaces.index(namespace) if namespace in self.namespaces else 0
        return self.rack if index % 2 else ""

    def cut_node(self, job: JobRef, pod: str, fault: str, back_after: float) -> str:
        """The power or the network of the node that runs ``pod`` cut; a thread brings it back once the job runs
        again in a later attempt (or after NODE_DOWN_SECONDS), ``back_after`` seconds later. Every other job with a
        live rank there is counted as hit."""
        body = self.rank_pod(job, pod)
        if not body.spec.node_name:
            raise NotInjected(f"{pod} is not on a node yet")
        node = self.box.node_named(body.spec.node_name)
        if self.kueue and node is self.box.node:
            raise NotInjected(f"{node.name} runs Kueue's manager")
        if not self._node_down.acquire(blocking=False):
            raise NotInjected("another node is down")
        try:
            attempt = int((status_now(self, job).get("attempt")) or 0)
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
        for process in self.operators:
            process.stop()
        for link in self._links.values():
            link.stop()
        self.api.close()


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


def restarted_or_over(stack: Stack, job: JobRef, attempt: int, restarts: int) -> Callable[[], dict[str, Any]]:
    """The status once the job has restarted past ``attempt``, counted a restart more than ``restarts`` (the ranks'
    supervisors restart the gang in place, in the same attempt), or ended; {} before."""

    def probe() -> dict[str, Any]:
        found = status(stack, job)
        over = found.get("phase") in ("Succeeded", "Failed")
        later = int(found.get("attempt", 0)) > attempt or int(found.get("restarts", 0)) > restarts
        return found if over or later else {}

    return probe


@contextmanager
def chaos_stack(
    parallel: int, kueue: bool = False, nodes: int = 1, topology: str = "", replicas: int = 1
) -> Iterator[Stack]:
    """A box with its ``nodes`` (the controller-manager's NODE_GRACE with several) and the trainer image, the CRD, a
    namespace per run going on at once, and the operator, watching those namespaces (the chart's namespaced
    mode)."""
    from bench.apiserver import Api
    from bench.operator_scale import apply_crd
    from ddpjob_box.box import Box
    from ddpjob_box.topology import parse as parse_topology

    with (
        tempfile.TemporaryDirectory(prefix="ddpjob-chaos-") as tmp,
        Box(
            Path(tmp) / "box",
            with_prometheus=False,
            with_kueue=kueue,
            node_count=nodes,
            topology=parse_topology(topology),
            controller_manager_args=list(NODE_GRACE) if nodes > 1 else [],
        ) as box,
    ):
        plane = box.plane
        assert plane is not None
        apply_crd(Api(plane.server, plane.admin_token, str(plane.ca_file)))
        namespaces = [f"chaos-ns-{i}" for i in range(parallel)]
        stack = Stack(box, namespaces, Path(tmp), kueue=kueue, replicas=replicas)
        try:
            for namespace in namespaces:
                stack.create_namespace(namespace)
            yield stack
        finally:
            stack.close()
