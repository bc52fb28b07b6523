"""Within an attempt: Pending until every pod exists (then launched), Rendezvous while the ranks join the process
group, Running once all have joined; Running stays for the rest of the attempt."""

from __future__ import annotations

from ddpjob_contract.status import Phase
from ddpjob_operator import progress_fold
from ddpjob_operator.transitions import Launch, Rendezvous, Run, Transition, Wait
from ddpjob_operator.view import View


def launch(v: View) -> Transition | None:
    """Launched once every pod of the attempt exists. Before ``cannot_start``: a pod the scheduler cannot place
    still exists, and its words, said first, held the launch back until some later event (none came in a cluster
    with no node: the job stayed unlaunched until the resync)."""
    status, obs = v.status, v.obs
    if status.launched_attempt < status.attempt and not obs.stale and not obs.missing:
        return Launch(v.job.spec.replicas)
    return None


def rule(v: View) -> Transition | None:
    """Within the attempt, once launched: Rendezvous, then Running."""
    spec, status, obs = v.job.spec, v.status, v.obs
    launched = status.launched_attempt >= status.attempt
    if not launched and not obs.stale and not obs.missing:
        return Launch(spec.replicas)
    started = launched and obs.all_started(spec.replicas)
    if started and status.phase is not Phase.RUNNING:
        joined = progress_fold.joined(v.job, status, obs, v.scrapes)
        return Rendezvous(joined, spec.world_size) if joined < spec.world_size else Run(spec.replicas, v.requested)
    if not started and status.phase not in (Phase.RESTARTING, Phase.RUNNING):  # within an attempt, Running stays
        return Wait()
    return None
