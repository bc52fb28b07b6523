"""The words of a DDPJob's status: its phases, its condition types and the reasons on conditions and Events."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    NEW = ""
    PENDING = "Pending"
    RENDEZVOUS = "Rendezvous"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"
    """Waiting for Kueue to admit its Workload (or evicted by Kueue, and waiting again): no pod exists."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    """In the order ``status.conditions`` lists them."""

    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    STRAGGLER_DETECTED = "StragglerDetected"
    GANG_SCHEDULING = "GangScheduling"
    QUEUED = "Queued"


class Reason(StrEnum):
    """Reasons on conditions and Events."""

    CREATED = "Created"
    LAUNCHED = "AttemptLaunched"
    PODS_PENDING = "PodsPending"
    CANNOT_START = "ContainerCannotStart"
    RENDEZVOUS = "Rendezvous"
    ALL_RUNNING = "AllRanksRunning"
    ALL_SUCCEEDED = "AllRanksSucceeded"
    STUCK_EXITING = "RanksStuckExiting"
    RETRYABLE = "RetryableFailure"
    NON_RETRYABLE = "NonRetryableFailure"
    BACKOFF = "BackoffLimitExceeded"
    DEADLINE = "DeadlineExceeded"
    NO_PROGRESS = "NoProgress"
    INVALID = "InvalidSpec"
    INVALID_POD = "InvalidPodTemplate"
    POD_CREATE_FAILED = "PodCreateFailed"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    SPEC_CHANGED = "SpecChanged"
    RECOVERED = "Recovered"
    STRAGGLER = "StragglerDetected"
    STRAGGLER_RECOVERED = "StragglerRecovered"
    TTL = "TTLExpired"
    UNSCHEDULABLE = "Unschedulable"
    TOPOLOGY_GATED = "WaitingForTopologyAssignment"
    PREEMPTED = "Preempted"
    DISRUPTED = "Disrupted"
    GANG = "PodGroup"
    GANG_NOT_SERVED = "PodGroupNotServed"
    GANG_DISABLED = "GangSchedulingDisabled"
    GANG_UNAVAILABLE = "GangSchedulingUnavailable"
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    EVICTED = "EvictedByKueue"
    KUEUE_NOT_INSTALLED = "KueueNotInstalled"
    WORKLOAD_MISSING = "WorkloadNotCreated"
    NODE_LOST = "NodeLost"
    NODE_UNHEALTHY = "NodeUnhealthy"
    EXCLUSIONS_CLEARED = "ExclusionsCleared"
