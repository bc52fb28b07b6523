"""What the policies read (``View``): the job, its status with this attempt's polls folded in, its pods observed
once, and what the cluster says around them. ``lifecycle`` builds it; each ``policies.<rule>.rule`` reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from ddpjob_operator import progress_fold, queueing
from ddpjob_operator.api import Job
from ddpjob_operator.node_health import ALL_HEALTHY, NodeHealth
from ddpjob_operator.progress import Scrape
from ddpjob_operator.status import JobStatus, Observation


class Placement(Enum):
    """How a job's ranks are placed (``policies.gang.placement``)."""

    GANG = "gang"
    ONE_BY_ONE = "one by one"
    UNAVAILABLE = "unavailable"
    """Required, but the cluster does not serve PodGroups: the job fails before any pod is made."""


@dataclass(frozen=True, kw_only=True)
class CreateErrors:
    """What went wrong the last time this job's pods were created, as the controller remembers it (empty: nothing)."""

    refused: str = ""
    """Why the apiserver refused a pod of this job as invalid: the job fails."""
    failed: str = ""
    """Why the last creation failed otherwise (a webhook down, a quota): retried, and said."""


@dataclass(frozen=True, kw_only=True)
class View:
    """What the policies read: the job, its status with this attempt's polls folded in, its pods observed once."""

    job: Job
    status: JobStatus
    obs: Observation
    now: datetime
    scrapes: Sequence[Scrape]
    fold: progress_fold.Fold | None
    """The newest polls of this attempt, if there are new ones."""
    creates: CreateErrors
    placement: Placement
    queueing: queueing.Queueing
    requested: int
    """spec.replicas as written (``job`` holds the admitted number under Kueue's partial admission)."""
    nodes: NodeHealth = ALL_HEALTHY
    """The nodes known to be lost or sick."""
