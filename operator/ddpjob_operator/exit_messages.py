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
from ddpjob_operator.times import from_unix, to_time


@dataclass(frozen=True, kw_only=True)
class ExitSummary:
    step: int
    samples_per_second: float | None
    step_seconds: float | None
    restarts: int = 0
    """In-place restarts of the gang's processes before the one that wrote it."""
    checkpoint: Checkpoint | None = None
    """The newest complete checkpoint that process saved or resumed from."""


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
        checkpoint=_checkpoint(raw),
    )


def _checkpoint(raw: Mapping[str, object]) -> Checkpoint | None:
    step = _number(raw.get(exits.SUMMARY_CHECKPOINT_STEP))
    if step is None or step <= 0:
        return None
    saved_at = _number(raw.get(exits.SUMMARY_CHECKPOINT_TIME))
    return Checkpoint(
        step=int(step),
        time=from_unix(saved_at),
        save_seconds=_number(raw.get(exits.SUMMARY_CHECKPOINT_SAVE_SECONDS)),
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


def saved_checkpoint(pods: Iterable[PodView], known: Checkpoint | None) -> Checkpoint | None:
    """The newest checkpoint the ranks' exit messages name, or ``known`` if none is newer. The ranks exit right
    after their last save, before a poll of their metrics can see it.

    A gang that stopped (a suspend, a preemption) says the step it saved (``exits.stopped_step``): its time is the
    rank's exit, just after the save, and its save time the last one measured (the same model to the same
    storage), which the next attempt's grace period is sized from. A rank that finished says its newest checkpoint
    in its summary (``exits.SUMMARY_CHECKPOINT_STEP``), with the time it was saved at."""
    best = known
    for pod in pods:
        found = _finished_checkpoint(pod) if pod.succeeded else _stopped_checkpoint(pod, best)
        if found is not None and (best is None or found.step > best.step):
            best = found
    return best


def _finished_checkpoint(pod: PodView) -> Checkpoint | None:
    summary = parse(pod.message)
    return summary.checkpoint if summary else None


def _stopped_checkpoint(pod: PodView, known: Checkpoint | None) -> Checkpoint | None:
    step = exits.stopped_step(pod.message) if pod.exit_code == exits.EXIT_SIGTERM else None
    if step is None:
        return None
    return Checkpoint(step=step, time=to_time(pod.finished_at), save_seconds=known.save_seconds if known else None)
