"""The ranks left once one has exited 0: they are exiting, and spec.progressDeadlineSeconds bounds how long.

A rank exits 0 only after the trainer's last barrier, which every rank reaches once it has finished
training and written its last checkpoint; so once one has exited 0, the training is done and the
others are leaving the process group. They are not hung (their metrics go quiet as their pods are torn
down, and a kubelet or apiserver that restarts reports their exits late), so NoProgress does not apply.
A rank that has not exited within spec.progressDeadlineSeconds of the first exit is stuck in its exit
(a teardown that never returns, as NCCL's sometimes does): the job has Succeeded all the same, and the
pods still running are deleted. A restart would redo nothing, and one stuck in the same teardown again
would fail the job.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ddpjob_contract.status import Phase, Reason
from ddpjob_operator import times
from ddpjob_operator.api import Job
from ddpjob_operator.status import JobStatus, Observation, PodView
from ddpjob_operator.transitions import Finish, Transition
from ddpjob_operator.view import View


def first_exit(pods: Iterable[PodView]) -> datetime | None:
    """When the first rank of the attempt exited 0, as kubelet recorded it (None: none has)."""
    exits = [t for p in pods if p.succeeded and (t := times.to_time(p.finished_at)) is not None]
    return min(exits, default=None)


def seconds_left(deadline_seconds: int | None, first: datetime | None, now: datetime) -> float | None:
    """None without a deadline or before any rank has exited 0; <= 0 once the others are overdue."""
    return times.seconds_left(first, deadline_seconds, now)


def _exiting(job: Job, status: JobStatus, obs: Observation) -> bool:
    """A rank of the attempt has exited 0 and others have not yet: the gang is leaving."""
    return (
        status.phase in (Phase.RUNNING, Phase.RENDEZVOUS)
        and bool(obs.succeeded)
        and not obs.all_succeeded(job.spec.replicas)
    )


def grace_left(job: Job, status: JobStatus, obs: Observation, now: datetime) -> float | None:
    """What is left of the exiting ranks' wait; None when there is none to bound."""
    if not _exiting(job, status, obs):
        return None
    return seconds_left(job.spec.progress_deadline_seconds, first_exit(obs.current.values()), now)


def rule(v: View) -> Transition | None:
    """Ranks that have not exited within spec.progressDeadlineSeconds of a peer's exit 0: the training is done
    (that peer passed the last barrier), so the job has Succeeded, and the stuck ranks are stopped."""
    left = grace_left(v.job, v.status, v.obs, v.now)
    if left is None or left > 0:
        return None
    limit = v.job.spec.progress_deadline_seconds
    done = [r for r, p in sorted(v.obs.current.items()) if p.succeeded]
    stuck = [f"rank {r} (pod {p.name})" for r, p in sorted(v.obs.current.items()) if not p.succeeded]
    exited = ", ".join(f"rank {r}" for r in done)
    return Finish(
        True,
        Reason.STUCK_EXITING,
        f"{exited} exited 0, so every rank finished training; not exited {limit}s after that "
        f"(spec.progressDeadlineSeconds={limit}), so stopped: {', '.join(stuck)}",
    )
