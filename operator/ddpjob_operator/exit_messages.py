"""Pure: the figures a finished run's ranks left in their exit messages (termination messages), and the
checkpoint a stopped gang saved on its way out.

The polls of /metrics stop when the pods end, so the last poll is up to a poll interval (and a
rate window) behind the end: a status built from polls alone showed step 427 of 500. Each rank
of our trainer leaves a one-line JSON summary as it exits 0 (``ddpjob_contract.exits``); once every
rank has, these replace the polled figures with the run's own final ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from ddpjob_contract import exits
from ddpjob_operator.progress import Checkpoint, ProgressStatus, RankProgress
from ddpjob_operator.status import PodView
from ddpjob_operator.times import to_time


@dataclass(frozen=True, kw_only=True)
class ExitSummary:
    step: int
    samples_per_second: float | None
    step_seconds: float | None
    restarts: int = 0
    """In-place restarts of the gang's processes before the one that wrote it."""


def parse(message: str) -> ExitSummary | None:
    """The trainer's summary, or None for any other message (text, a log's tail, nothing)."""
    try:
        raw = json.loads(message)
    except ValueError:
        return None
    if not isinstance(raw, Mapping):
        return None
    step = raw.get(exits.SUMMARY_STEP)
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    return ExitSummary(
        step=step,
        samples_per_second=_number(raw.get(exits.SUMMARY_SAMPLES_PER_SECOND)),
        step_seconds=_number(raw.get(exits.SUMMARY_STEP_SECONDS)),
        restarts=int(_number(raw.get(exits.SUMMARY_RESTARTS)) or 0),
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def final_progress(
    old: ProgressStatus, pods: Mapping[int, PodView], nproc_per_node: int, at: datetime | None
) -> ProgressStatus | None:
    """The run's final figures from the exit summaries of the pods that exited 0; None unless each of them
    left one. Those are every pod, or, in a job whose other ranks were stuck exiting, the ones that exited.

    A pod's summary speaks for each of its ``nproc_per_node`` processes, and the ranks train in lockstep,
    so the job's samples per second is the mean over those pods times every process of the job.
    """
    summaries = {rank: parse(pod.message) for rank, pod in pods.items() if pod.succeeded}
    found = {rank: s for rank, s in summaries.items() if s is not None}
    if not found or len(found) < len(summaries):
        return None
    rates = [s.samples_per_second for s in found.values()]
    times = [s.step_seconds for s in found.values() if s.step_seconds is not None]
    step_time = sum(times) / len(times) if times else None
    mean_rate = sum(r for r in rates if r is not None) / len(rates)
    return replace(
        old,
        final=True,
        step=max(s.step for s in found.values()),
        samples_per_second=round(mean_rate * len(pods) * nproc_per_node, 1) if None not in rates else None,
        step_time_p50=round(step_time, 4) if step_time is not None else None,
        window_seconds=None,
        observed_time=at or old.observed_time,
        ranks=tuple(
            RankProgress(
                rank=rank * nproc_per_node,
                pod=pods[rank].name,
                node=pods[rank].node,
                step=s.step,
                step_seconds=s.step_seconds,
            )
            for rank, s in sorted(found.items())
        ),
    )


def restarts_in_place(pods: Iterable[PodView]) -> int:
    """The most in-place restarts of the gang's processes that a rank which exited 0 says came before it."""
    said = (parse(pod.message) for pod in pods if pod.succeeded)
    return max((s.restarts for s in said if s is not None), default=0)


def stopped_checkpoint(pods: Iterable[PodView], known: Checkpoint | None) -> Checkpoint | None:
    """The checkpoint a gang saved as it stopped (a suspend, a preemption), from a rank's exit message
    (``exits.stopped_step``), or ``known`` if that is not newer. The ranks exit right after the save, before a
    poll of their metrics can see it. Its time is the rank's exit, just after the save; its save time is the last
    one measured (the same model to the same storage), which the next attempt's grace period is sized from."""
    best = known
    for pod in pods:
        step = exits.stopped_step(pod.message) if pod.exit_code == exits.EXIT_SIGTERM else None
        if step is not None and (best is None or step > best.step):
            measured = best.save_seconds if best else None
            best = Checkpoint(step=step, time=to_time(pod.finished_at), save_seconds=measured)
    return best
