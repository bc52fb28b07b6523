"""Which pods of an earlier attempt a gang restart keeps: those its kubelet restarts in place.

A rank pod built with a RestartAllContainers rule (``builders.restart_rules``) is restarted by its kubelet, every
container of it, init containers first, when its trainer exits with a code the restart policy retries: same pod,
node, IP, volumes and PodGroup. After the operator's Restart, such a pod of the last attempt is *adopted* into the
new one (its attempt label moved, the exit that began it remembered) once its trainer has exited. A rank that has
not exited within ``WAIT_SECONDS`` of the restart (blocked in a collective that a lost peer does not end, as NCCL
can be) is deleted and made again (at once when the restart is put down to a lost node: ``wait_seconds``), as is any
pod that cannot be restarted in place: gone from its node, being
deleted, taken away by Kubernetes, ended for good, or built from an older spec.

The last attempt that ``backoffLimit`` allows is never in place (``for_attempt``): its pods are made anew without the
rule, so that its failure, which ends the job, ends the pods as they failed. The kubelet does not restart them for
nothing, and their exit (OOMKilled, the code, the message) stays readable: a restart in place replaces it with its
own ``RestartingAllContainers``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from ddpjob_contract.status import Reason
from ddpjob_operator import exit_messages
from ddpjob_operator.api import InPlaceRestart, RestartPolicy, RunPolicy
from ddpjob_operator.policies.restart import is_retryable, no_restarts_left
from ddpjob_operator.status import Failure, PodView
from ddpjob_operator.transitions import Finish, RestartedInPlace, Transition
from ddpjob_operator.view import View

WAIT_SECONDS = 10.0
"""How long a rank of the last attempt may run on after the gang restarted before it is deleted."""


@dataclass(frozen=True)
class Sorted:
    adopt: tuple[PodView, ...] = ()
    """Exited, and restarted (or about to be) by their kubelet: moved into the new attempt."""
    wait: tuple[PodView, ...] = ()
    """Still running the last attempt's process: given ``WAIT_SECONDS`` to exit."""
    delete: tuple[PodView, ...] = ()
    wait_left: float | None = None
    """Seconds until the first waiting rank is deleted (None: none waits)."""


def restartable(pod: PodView, policy: RunPolicy, spec_hash: str) -> bool:
    """Whether the pod can join the next attempt in place at all."""
    retried = pod.restarted_by_kubelet or (pod.exit_code != 0 and is_retryable(_failure(pod), policy))
    return (
        pod.in_place
        and pod.phase in ("Running", "Pending")  # Pending: its init containers run again
        and not pod.terminating
        and pod.disruption is None
        and pod.spec_hash == spec_hash
        and pod.rank is not None
        and (pod.exit_code is None or retried)
    )


def _failure(pod: PodView) -> Failure:
    return Failure(rank=pod.rank or 0, pod=pod.name, exit_code=pod.exit_code)


def in_process(policy: RunPolicy, restarts: int) -> int:
    """How many times the ranks' own supervisors may restart the gang's processes in place, without the kubelet or
    the operator (the trainer's ``--max-restarts``, told through ``MAX_RESTARTS``), in an attempt begun after
    ``restarts`` restarts: the restarts left, under ``inPlaceRestart: Auto`` and a policy that retries at all; else
    0. The operator counts each from the ranks' polls (``ddp_restart_count``)."""
    if policy.in_place_restart is not InPlaceRestart.AUTO or policy.restart_policy is RestartPolicy.NEVER:
        return 0
    return max(0, policy.backoff_limit - restarts)


def for_attempt(policy: RunPolicy, restarts: int) -> bool:
    """Whether an attempt begun after ``restarts`` restarts may run in place: a failure of it may restart it."""
    return restarts < policy.backoff_limit


def sort(
    stale: Sequence[PodView],
    policy: RunPolicy,
    spec_hash: str,
    replicas: int,
    since: datetime | None,
    now: datetime,
    restarts: int,
    wait_seconds: float = WAIT_SECONDS,
    excluded: Collection[str] = (),
) -> Sorted:
    """Sort the pods of earlier attempts for a gang restarted at ``since`` (None: not restarting) into an attempt
    begun after ``restarts`` restarts, giving a rank still running ``wait_seconds`` to exit. A pod on a node of
    ``excluded`` (the job's ``excludedNodes``) is never kept: its kubelet would restart it on the node the gang
    leaves (a rank that faulted its machine twice there was adopted, and trained on there)."""
    adopt: list[PodView] = []
    wait: list[PodView] = []
    delete: list[PodView] = []
    waited = (now - since).total_seconds() if since is not None else wait_seconds
    kept = since is not None and for_attempt(policy, restarts)
    for pod in stale:
        in_range = pod.rank is not None and 0 <= pod.rank < replicas
        if not kept or not in_range or pod.node in excluded or not restartable(pod, policy, spec_hash):
            delete.append(pod)
        elif pod.exit_code is not None:
            adopt.append(pod)
        elif waited < wait_seconds and pod.trainer_running:
            wait.append(pod)
        else:
            delete.append(pod)
    return Sorted(tuple(adopt), tuple(wait), tuple(delete), wait_seconds - waited if wait else None)


def wait_seconds(reason: str) -> float:
    """How long a gang restart put down to ``reason`` waits for its running ranks to exit: none when a node was lost.
    Its ranks there may run on behind a partition, still reaching the others, so nothing makes those exit: waiting
    only delays the restart (10 s of the 35 a network cut took on the box, bench.node_loss)."""
    return 0.0 if reason == Reason.NODE_LOST.value else WAIT_SECONDS


def unproven(v: View) -> int:
    """The restart an in-place restart of this attempt was counted as, when no step has been seen since (0 when
    none): a rank failing now failed that restart, not anew."""
    progress = v.status.progress
    if progress is None or progress.attempt != v.status.attempt or not progress.restarts_in_place:
        return 0
    return v.status.restarts if not progress.step else 0


def rule(v: View) -> Transition | None:
    """The ranks' supervisors restarted the gang's processes in place (``in_process``), as their
    polls say: each restart is counted, as the operator's own are; past backoffLimit (possible only when a pod
    restarted in place by its kubelet kept the env of an earlier attempt), the job has failed."""
    counted = v.status.progress.restarts_in_place if v.status.progress else 0
    polled = v.fold.summary.restart_count if v.fold else 0
    seen = max(polled, exit_messages.restarts_in_place(v.obs.current.values()))  # those the polls missed at the end
    if seen <= counted:
        return None
    rp = v.job.spec.run_policy
    why = v.fold.summary.restart_reason if v.fold and polled == seen else ""
    if v.status.restarts + seen - counted > rp.backoff_limit:
        return Finish(False, Reason.BACKOFF, f"{why or 'a rank failed'}, and its processes restarted in place; "
                                             f"{no_restarts_left(rp.backoff_limit)}")  # fmt: skip
    at = v.fold.summary.at if v.fold else v.now
    return RestartedInPlace(seen - counted, seen, why, rp.backoff_limit, at)
