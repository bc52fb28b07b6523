"""Pure: this attempt's polls of the ranks' metrics folded into ``status.progress``, and what the lifecycle
policies read of them (who joined, who is stuck, who straggles), and where to poll next.

``lifecycle`` makes the plan; this module is the one that reads the polls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddpjob_contract.status import ConditionType, Phase
from ddpjob_operator import exit_messages, progress
from ddpjob_operator.api import Job
from ddpjob_operator.policies import progress_deadline, straggler
from ddpjob_operator.progress import ProgressStatus, RankProgress, Scrape, Straggler, Summary, Target
from ddpjob_operator.status import JobStatus, Observation

RENDEZVOUS_POLL_SECONDS = 2.0
"""Poll this often while ranks are joining: the wait for Running is short and worth seeing soon."""


def poll_targets(job: Job, obs: Observation, silent: frozenset[int] = frozenset()) -> tuple[Target, ...]:
    """Every process of every running pod of this attempt (pod i, process j is rank i * nproc + j), but
    the ``silent`` ranks, whose program serves no metrics."""
    spec = job.spec
    found: list[Target] = []
    for rank, pod in sorted(obs.current.items()):
        if not (pod.running and pod.ip):
            continue
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
        for local in range(spec.nproc_per_node):
            url = f"http://{host}:{spec.metrics_port + local}/metrics"
            target = Target(rank=rank * spec.nproc_per_node + local, pod=pod.name, node=pod.node, url=url)
            if target.rank not in silent:
                found.append(target)
    return tuple(found)


def silent_in_attempt(status: JobStatus) -> frozenset[int]:
    p = status.progress
    return frozenset(p.silent) if p is not None and p.attempt == status.attempt else frozenset()


def silent_note(job: Job, silent: Sequence[int]) -> str:
    """'rank 1 serves no metrics on port 9090: progress is not shown for it', or '' for none."""
    nproc, port = job.spec.nproc_per_node, job.spec.metrics_port
    said = [f"rank {r} serves no metrics on port {port + r % nproc}" for r in silent]
    return f"{', '.join(said)}: progress is not shown for {'it' if len(said) == 1 else 'them'}" if said else ""


def poll_interval(job: Job, phase: Phase) -> float:
    """Often enough to see a window four times over, never more than once a second."""
    if phase is not Phase.RUNNING:
        return RENDEZVOUS_POLL_SECONDS
    spec = job.spec
    windows = [progress.WINDOW_SECONDS, float(spec.straggler.window_seconds)]
    if spec.progress_deadline_seconds is not None:
        windows.append(float(spec.progress_deadline_seconds))
    return max(1.0, min(windows) / 4)


def joined(job: Job, status: JobStatus, obs: Observation, scrapes: Sequence[Scrape]) -> int:
    """Ranks that joined the process group: as the polls saw them, plus the ranks that already exited 0."""
    nproc = job.spec.nproc_per_node
    seen = progress.joined_ranks(s for s in scrapes if s.attempt == status.attempt)
    done = {rank * nproc + i for rank, p in obs.current.items() if p.succeeded for i in range(nproc)}
    remembered = status.progress.joined if status.progress and status.progress.attempt == status.attempt else 0
    silent = silent_in_attempt(status)  # serve no metrics: their running pods are all we can know
    return min(job.spec.world_size, max(remembered, len(seen | done | silent)))


def outcome(job: Job, status: JobStatus, obs: Observation) -> ProgressStatus | None:
    """A finished job's progress holds its outcome, not its last poll.

    No rank carries a poll's error: the pods' exits decide, and the conditions say why; nor does the pace of the
    last polls stay (a finished run has no ETA). A succeeded run's figures are its ranks' own, from their exit
    messages (once: then they are final); every one of its ranks joined (all passed the last barrier to exit 0);
    and a rank that never answered a poll served no metrics, which the note says once, as the silent-rank rule
    does in a longer run.
    """
    if not status.phase.finished or status.progress is None:
        return status.progress
    spec = job.spec
    old = replace(progress.fresh(status.progress, status.attempt, spec.world_size), steps_per_second=None)
    if status.phase is not Phase.SUCCEEDED:
        return replace(old, ranks=tuple(replace(r, error="") for r in old.ranks))
    if not old.final:
        old = exit_messages.final_progress(old, obs.current, spec.nproc_per_node, status.completion_time) or old
    # The exit summaries speak for every process of their pods; else a rank is heard from by its polls alone.
    heard = set(range(spec.world_size)) if old.final else {r.rank for r in old.ranks if r.step is not None}
    silent = tuple(sorted(set(old.silent) | (set(range(spec.world_size)) - heard)))
    ranks: tuple[RankProgress, ...] = tuple(replace(r, error="") for r in old.ranks if r.rank not in silent)
    window = old.window_seconds if heard else None  # a window of refused polls holds no figure
    return replace(old, joined=spec.world_size, ranks=ranks, silent=silent, note=silent_note(job, silent),
                   window_seconds=window)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Fold:
    """New polls of this attempt folded into status.progress, with what the straggler rule reads."""

    progress: ProgressStatus
    summary: Summary
    candidate: tuple[int, float, float] | None
    """(rank, its work seconds per step, the others' median), from the newest poll."""
    known: bool
    """Whether the newest poll timed every rank (else the straggler rule changes nothing)."""
    previous: Straggler | None
    """The straggler the status remembered before these polls."""


def fold(job: Job, old: ProgressStatus, scrapes: Sequence[Scrape]) -> Fold | None:
    """None when there is no poll newer than what status.progress already holds."""
    spec = job.spec
    summary = progress.summarize(scrapes)
    if summary is None or (old.observed_time is not None and summary.at < old.observed_time):
        return None
    step = summary.step
    if old.restarts_in_place:  # the step the restarted processes reached: 0 until they train one
        step = progress.step_since_restart(scrapes, old.restarts_in_place)
    advanced = step is not None and step > (old.step or 0)
    ranks = {r.rank for r in summary.ranks}
    known = len(ranks) > 1 and ranks <= set(summary.recent_work)
    candidate = progress.straggler_candidate(summary.recent_work, spec.straggler.factor) if known else None
    # A rank keeps the last step it answered with while it does not answer (a hung rank, once its answers have
    # left the poller's window): it is known, so it is never taken for one that serves no metrics.
    last_step = {r.rank: r.step for r in old.ranks if r.step is not None}
    silent = tuple(sorted(set(old.silent) | progress.silent_ranks(scrapes, last_step)))
    kept = tuple(
        replace(r, step=last_step[r.rank]) if r.step is None and r.rank in last_step else r
        for r in summary.ranks
        if r.rank not in silent
    )
    new = replace(
        old,
        silent=silent,
        note=silent_note(job, silent),
        joined=min(spec.world_size, max(old.joined, len(summary.joined))),
        step=step if step is not None else old.step,
        total_steps=summary.total_steps if summary.total_steps is not None else old.total_steps,
        steps_per_second=summary.steps_per_second,
        samples_per_second=summary.samples_per_second,
        step_time_p50=summary.step_time_p50,
        window_seconds=summary.window_seconds,
        slowest_rank=summary.slowest_rank,
        last_progress_time=summary.at if advanced else old.last_progress_time,
        observed_time=summary.at,
        ranks=kept,
        straggler=straggler.track(
            old.straggler,
            candidate[0] if candidate else None,
            known=known,
            now=summary.at,
            window_seconds=spec.straggler.window_seconds,
        ),
    )
    return Fold(progress=new, summary=summary, candidate=candidate, known=known, previous=old.straggler)


def rank_name(fold: Fold, rank: int) -> str:
    """rank 3 (pod train-1 on node a), from the polls, else from what the status remembered."""
    found = next((r for r in (*fold.summary.ranks, *fold.progress.ranks) if r.rank == rank), None)
    return f"rank {rank} (pod {found.pod} on node {found.node or 'unknown'})" if found else f"rank {rank}"


def straggler_message(job: Job, fold: Fold, rank: int) -> str:
    assert fold.candidate is not None
    _, work, median = fold.candidate
    factor, window = job.spec.straggler.factor, job.spec.straggler.window_seconds
    return (
        f"{rank_name(fold, rank)} works {work:.3g}s per step, "
        f"{work / median if median else float('inf'):.1f}x the median of the others ({median:.3g}s), for {window}s "
        f"(spec.straggler factor {factor:g}, window {window}s)"
    )


def stuck(job: Job, status: JobStatus, summary: Summary) -> str:
    """Why the progress deadline has passed (naming the ranks that did not answer), or "" if it has not."""
    prog = status.progress
    running = status.condition(ConditionType.RUNNING)
    running_since = running.last_transition_time if running and running.status else None
    last = prog.last_progress_time if prog else None
    limit = job.spec.progress_deadline_seconds
    # Every rank went quiet at once: a rank blocked in a collective behind a hung peer still answers (its
    # metrics are served by a thread of their own), so a gang that is all quiet is most likely gone: ranks
    # that exited, in pods kubelet tore down before it could say so (late while it or the apiserver
    # restarts). Their exits decide; a gang truly wedged as a whole (every process stopped, or stuck holding
    # the GIL) restarts one deadline later.
    quiet = bool(summary.ranks) and all(r.error for r in summary.ranks)
    # A rank whose program is gone (its poll refused) is most likely exiting: kubelet reports its exit (a kubelet
    # that is restarting reports it late), and that exit, a success or a failure, decides, for one deadline more.
    # A program gone while its container stays up (its supervisor waiting on a gang that never comes) is then
    # judged as hung: excused for ever, it stalled the gang with nothing said (chaos 11:1).
    gone = any(r.error == progress.REFUSED for r in summary.ranks)
    waited = limit * (1 + quiet + gone) if limit is not None else None
    if not progress_deadline.exceeded(waited, running_since=running_since, last_progress=last, observed=summary.at):
        return ""
    step = prog.step if prog and prog.step is not None else 0
    twice = ", twice over: every rank went quiet" if quiet else ""
    gone_too = ", and once more: a rank's program is gone" if gone else ""
    why = (f"no rank advanced its step for {waited}s (spec.progressDeadlineSeconds={limit}{twice}{gone_too}); "
           f"stuck at step {step}")  # fmt: skip
    silent = [f"rank {r.rank} (pod {r.pod} on node {r.node or 'unknown'}: {r.error})" for r in summary.ranks if r.error]
    return why + (f"; not answering: {', '.join(silent)}" if silent else "")
