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

from ddpjob_operator import times
from ddpjob_operator.status import PodView


def first_exit(pods: Iterable[PodView]) -> datetime | None:
    """When the first rank of the attempt exited 0, as kubelet recorded it (None: none has)."""
    exits = [t for p in pods if p.succeeded and (t := times.to_time(p.finished_at)) is not None]
    return min(exits, default=None)


def seconds_left(deadline_seconds: int | None, first: datetime | None, now: datetime) -> float | None:
    """None without a deadline or before any rank has exited 0; <= 0 once the others are overdue."""
    return times.seconds_left(first, deadline_seconds, now)
