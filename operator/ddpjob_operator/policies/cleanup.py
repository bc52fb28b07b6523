"""cleanPodPolicy once the job has finished.

``All`` deletes every pod. ``Running`` (the default) deletes the pods still running, keeping the
finished ones for their logs. A pod whose trainer has exited is finished unless a sidecar in it still
runs, though kubelet reports its phase as Running until it has torn the pod down, seconds later.
``None`` deletes nothing: after a failure the surviving ranks stay up, to be inspected (py-spy, exec).
A job that ran past its deadline loses its running pods whatever the policy (the deadline is a limit
on resources), and so does one whose ranks were stuck exiting after the training was done
(``stop_running``; policies.exit_grace).
"""

from __future__ import annotations

from collections.abc import Iterable

from ddpjob_operator.api import CleanPodPolicy
from ddpjob_operator.status import PodView


def pods_to_delete(policy: CleanPodPolicy, pods: Iterable[PodView], *, stop_running: bool = False) -> list[str]:
    chosen = []
    for pod in pods:
        if pod.terminating:
            continue
        if policy is CleanPodPolicy.ALL or ((policy is CleanPodPolicy.RUNNING or stop_running) and not pod.finished):
            chosen.append(pod.name)
    return chosen
