"""The chaos soak's faults: their kinds (those that cost the job a restart, those on the box itself, those that end
the run, and those that join the draw with ``--kueue`` or several nodes), each run's draw of them (``drawn``), and
their injection (``inject``; ``preempt`` with ``--kueue``). A fault that finds nothing to act on raises the stack's
``NotInjected``; one that finds a promise broken on the spot, ``Broken``."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

from bench.chaos.job import HIGH, JobRef, chaos_job
from bench.chaos.stack import ELECTION, SUSPENDED_OR_OVER, NotInjected, Stack, status, wait
from ddpjob_contract.kueue import LABEL_PRIORITY_CLASS
from ddpjob_contract.status import Reason

RESTARTING = ("kill-rank", "delete-pod", "hang-rank")
"""Faults that cost the job one counted restart."""
BOX_FAULTS = ("kill-operator", "kill-operator-at-point", "restart-kubelet", "restart-apiserver", "restart-etcd")
"""Faults on the box itself: every job alive at the time sees them."""
ENDING = ("delete-job", "delete-namespace")
"""Faults that end the run: the job, or its whole namespace, deleted while it runs. Drawn, they come last."""
OPERATOR_POINTS = ("pod-created:1", "pod-created:2", "pod-deleted:1")
"""Where kill-operator-at-point arms the operator (ddpjob_contract.faults): it exits at its next pass there,
in whichever job's work brings it, between one rank's pod and the next, or mid gang restart."""
FAULTS = (*RESTARTING, *BOX_FAULTS, "suspend-resume", "spec-edit", *ENDING)
KUEUE_FAULTS = ("preempt", "restart-kueue")
"""With --kueue: a high-priority job takes the run's quota (Kueue evicts the run's job, which must resume from its
checkpoint once the other is done, with no restart counted), and Kueue's manager killed and started again."""
NODE_FAULTS = ("power-cut", "network-cut")
"""With --nodes N (N > 1): the node of one of the run's ranks loses its power or its network, and comes back once
the job runs again elsewhere (or after NODE_DOWN_SECONDS). One restart, NodeLost, for the run's job; any other run's
job with a live rank there restarts too, counted as a restart it may have (``Run.node_hits``). One node is down at
a time."""
HA_FAULTS = ("kill-leader", "cut-leader")
"""With two operator replicas (``--replicas 2``): the leader SIGKILLed, or its way to the apiserver cut past its
lease (as its node's network would be), then back."""
PREEMPT_SECONDS = 120
"""How long a preemptor may take to evict a running job (Kueue's scheduling cycle, the operator's 2 s look)."""


def drawn(
    seed: int, index: int, *, kueue: bool = False, nodes: int = 1, replicas: int = 1
) -> tuple[random.Random, list[str]]:
    """A run's faults, in the order it injects them (a deletion last: it ends the run), and the generator
    that goes on to draw their timing; ``kueue`` adds KUEUE_FAULTS to those drawn from, several ``nodes``
    NODE_FAULTS, two ``replicas`` HA_FAULTS."""
    rng = random.Random(f"{seed}:{index}")
    kinds = (*FAULTS, *(KUEUE_FAULTS if kueue else ()), *(NODE_FAULTS if nodes > 1 else ()),
             *(HA_FAULTS if replicas > 1 else ()))  # fmt: skip
    faults = rng.sample(kinds, rng.randint(1, 3))
    return rng, sorted(faults, key=lambda fault: fault in ENDING)


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


def _stat(pid: int) -> tuple[str, int]:
    """(state, parent) from /proc/<pid>/stat; ("gone", 0) once it has exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "gone", 0
    return fields[0], int(fields[1])


def _family(pid: int) -> str:
    """'pid 12 T (python ...); parent 9 S (...); siblings [13 S]': the stopped process among its parent's children,
    each with its state (T: stopped), so that a record shows whether the training process itself hung."""
    from ddpjob_box.processes import children

    state, parent = _stat(pid)
    others = ", ".join(f"{p} {_stat(p)[0]}" for p in sorted(children(parent) - {pid}))
    return (f"pid {pid} {state} ({_command(pid)}); parent {parent} {_stat(parent)[0]} ({_command(parent)}); "
            f"siblings [{others}]")  # fmt: skip


def _command(pid: int) -> str:
    """The process's command line, shortened: the supervisor and the training process differ in it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return "gone"
    return " ".join(w.decode(errors="replace") for w in words if w)[:80]


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
            pid = trainer_pid(stack, job, pod)
            os.kill(pid, signal.SIGSTOP)
            return f"{pod}: {_family(pid)}"  # a violation's record says which process hung, and what was around it
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
        case "kill-leader":
            killed: list[str] = []
            stack.box_fault(lambda: killed.append(stack.kill_leader()))
            return f"{killed[0]} killed"
        case "cut-leader":
            cut: list[tuple[str, bool]] = []
            stack.box_fault(lambda: cut.append(stack.cut_leader(ELECTION["lease-duration"] + 5.0)))
            name, exited = cut[0]
            if not exited:
                raise Broken(f"{name}, cut off from the apiserver past its lease, did not stop and exit")
            return f"{name} cut"
        case "power-cut" | "network-cut":
            return stack.cut_node(job, pod, fault, back_after=rng.uniform(0.0, 20.0))
        case "delete-job":
            stack.delete_job(job)
        case "delete-namespace":
            stack.call(stack.core.delete_namespace, job.namespace)
    return ""


def preempt(stack: Stack, job: JobRef) -> None:
    """A high-priority job that needs the run's 2 slots: Kueue must evict the run's job (Queued, EvictedByKueue,
    its pods gone), and admit it again once the preemptor has Succeeded."""
    name = f"{job.name}-hi"
    # Restarts left for other runs' node cuts under it: with none, one failed it (11:9, --kueue --nodes 4).
    body = chaos_job(name, job.claim, 3, kueue=True, rack=stack.rack_of(job.namespace), avoid=stack.avoid)
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
