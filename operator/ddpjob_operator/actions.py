"""What one reconcile does: the ``Plan`` that ``lifecycle.plan`` returns and the controller executes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpjob_operator import progress, queueing
from ddpjob_operator.events import Event
from ddpjob_operator.progress import Target
from ddpjob_operator.status import JobStatus, PodView

RESYNC_SECONDS = 300.0
"""Reconcile a live job at least this often, even when no event arrives."""
KUEUE_POLL_SECONDS = 2.0
"""Read a queued job's Workload this often where no watch delivers Kueue's writes (``queueing.Queueing.watched``)."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    status: JobStatus
    create_service: bool = False
    """Create the job's headless Service if absent: planned with the pods of each attempt."""
    gang: bool = False
    """The ranks are placed as one gang: each pod names the attempt's PodGroup."""
    create_pod_group: bool = False
    """Create the attempt's PodGroup if absent (and delete older attempts'): planned with its pods."""
    create_ranks: tuple[int, ...] = ()
    """Ranks of ``status.attempt`` to create if absent."""
    delete_pods: tuple[PodView, ...] = ()
    delete_job: bool = False
    events: tuple[Event, ...] = field(default_factory=tuple)
    requeue_after: float | None = None
    poll: tuple[Target, ...] = ()
    """The ranks' metrics endpoints to poll for progress (none: stop polling this job)."""
    poll_interval: float = progress.WINDOW_SECONDS / 4
    placement: queueing.Placement = field(default_factory=queueing.Placement)
    """What Kueue's admission adds to every pod made (its flavors' node labels and tolerations)."""
    create_workload: bool = False
    """Create the job's Kueue Workload if absent: before any pod."""
    workload_status: tuple[queueing.StatusApply, ...] = ()
    """What to tell Kueue (PodsReady, the eviction acknowledged, Finished), after the job's status is written."""
    release_workload: bool = False
    """Drop Kueue's finalizer from the Workload."""
    adopt_pods: tuple[PodView, ...] = ()
    """Pods of the last attempt that their kubelet restarts in place: moved into ``status.attempt``
    (``policies.in_place``)."""
    force_delete_pods: tuple[PodView, ...] = ()
    """Pods on a lost node, to delete with no grace period: its kubelet cannot confirm (``policies.node_loss``)."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes every pod made is kept off (``status.excludedNodes``)."""


def deletable(pods: Sequence[PodView]) -> tuple[PodView, ...]:
    """The pods not already being deleted."""
    return tuple(p for p in pods if not p.terminating)


def soonest(*values: float | None) -> float | None:
    """The smallest of the waits given (None: no wait)."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


def next_look(plan: Plan) -> float | None:
    """Seconds until the job is reconciled again once ``plan`` is carried out (None: only on events). At once after
    making pods or adopting them: the pod cache holds our writes' answers already, so the watch's echo of them wakes
    nothing, and the next plan has work left (the status of pods just made; the ranks to make beside pods just
    adopted). Otherwise as the plan says."""
    return 0.0 if plan.create_ranks or plan.adopt_pods else plan.requeue_after
