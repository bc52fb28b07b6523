"""Pure: training progress read from the ranks' /metrics, summarised over a window.

The poller (``poller.py``) scrapes every rank's endpoint on an interval and keeps the scrapes of
the last window in memory; this module is the arithmetic on those scrapes, and the
``status.progress`` the operator writes from it. Nothing here does I/O.

Why a rank's *work* time and not its step time: DDP runs every rank at the pace of the slowest,
because the gradient all-reduce in ``backward`` waits for all of them. So every rank's wall step
time is the same, and a straggler shows up as the rank that spends longest on the phases it does
alone (data, forward, optimizer) while its peers wait for it in ``backward``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ddpjob_contract import metrics as names
from ddpjob_operator import eta
from ddpjob_operator.times import from_time, from_unix, to_time

WINDOW_SECONDS = 60.0
"""The status figures (samples/s, step time p50, per-rank times) cover at most the last minute."""
WORK_PHASES = ("data", "forward", "optimizer")
"""The phases a rank does on its own; ``backward`` holds the wait for the slowest peer."""
MIN_EXCESS_SECONDS = 0.005
"""A straggler's work time must also exceed the others' median by this much: ignore jitter of fast steps."""
SILENT_TRIES = 5
SILENT_SECONDS = 45.0
"""A rank asked this many times over this long that never answered in its attempt serves no metrics."""


# ---------------------------------------------------------------------------------------------
# One scrape of one rank


REFUSED = "connection refused: nothing listens on its metrics port (its program has exited)"
"""A poll's error when the rank's program is gone, not hung: its pod's exit, which kubelet reports, decides."""


@dataclass(frozen=True, kw_only=True)
class RankSample:
    """The counters of one rank's /metrics at one moment (cumulative since its process started)."""

    ready: bool = False
    """ddp_process_group_ready == 1: this rank has joined the process group."""
    step: float | None = None
    """ddp_step, the training step reached (survives resume); None from a trainer without it."""
    target: float | None = None
    """ddp_target_step, the step the run ends at; None from a program that does not know it (or says 0)."""
    steps: float = 0.0
    samples: float = 0.0
    step_sum: float = 0.0
    step_count: float = 0.0
    step_buckets: tuple[tuple[float, float], ...] = ()
    """(upper bound, cumulative count) of the ddp_step_seconds histogram, ascending."""
    phase_sums: Mapping[str, float] = field(default_factory=dict)
    checkpoint_step: float = 0.0
    """ddp_last_checkpoint_step: the newest checkpoint this process saved or resumed from (0: none yet)."""
    checkpoint_time: float = 0.0
    """ddp_last_checkpoint_timestamp_seconds (0: unknown)."""
    save_seconds: float = 0.0
    """ddp_checkpoint_save_seconds: its last save's wall time (0: it saved none)."""
    restart_count: int = 0
    """ddp_restart_count: in-place restarts of the gang's processes before this one (its supervisor's count)."""
    restart_reason: str = ""
    """ddp_restart_info's reason: why the last of them happened (empty before any)."""

    @property
    def reached(self) -> float:
        return self.step if self.step is not None else self.steps

    @property
    def work_sum(self) -> float:
        return sum(self.phase_sums.get(p, 0.0) for p in WORK_PHASES)

    def minus(self, older: RankSample | None) -> RankSample:
        """What happened between ``older`` and this sample (from process start when None)."""
        if older is None or self.step_count < older.step_count:  # a restarted process: counters reset
            return self
        old_buckets = dict(older.step_buckets)
        return RankSample(
            ready=self.ready,
            step=self.step,
            target=self.target,
            steps=self.steps - older.steps,
            samples=self.samples - older.samples,
            step_sum=self.step_sum - older.step_sum,
            step_count=self.step_count - older.step_count,
            step_buckets=tuple((le, n - old_buckets.get(le, 0.0)) for le, n in self.step_buckets),
            phase_sums={p: v - older.phase_sums.get(p, 0.0) for p, v in self.phase_sums.items()},
            checkpoint_step=self.checkpoint_step,
            checkpoint_time=self.checkpoint_time,
            save_seconds=self.save_seconds,
            restart_count=self.restart_count,
            restart_reason=self.restart_reason,
        )


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> RankSample:
    """Read the trainer's Prometheus text; unknown lines are ignored, missing metrics stay zero."""
    values: dict[str, float] = {}
    buckets: list[tuple[float, float]] = []
    phases: dict[str, float] = {}
    reason = ""
    for line in text.splitlines():
        if not line.startswith("ddp_"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        name, labels_text, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        labels = dict(_LABEL.findall(labels_text or ""))
        if name == f"{names.STEP_SECONDS}_bucket" and "le" in labels:
            buckets.append((math.inf if labels["le"] == "+Inf" else float(labels["le"]), value))
        elif name == f"{names.PHASE_SECONDS}_sum" and names.PHASE_LABEL in labels:
            phases[labels[names.PHASE_LABEL]] = value
        elif name == f"{names.RESTART_INFO}_info" and names.RESTART_REASON_LABEL in labels:
            reason = labels[names.RESTART_REASON_LABEL].replace('\\"', '"').replace("\\\\", "\\")
        elif not labels:
            values[name] = value
    target = values.get(names.TARGET_STEP)
    return RankSample(
        ready=values.get(names.PROCESS_GROUP_READY, 0.0) >= 1.0,
        step=values.get(names.STEP),
        target=target if target is not None and target > 0 else None,
        steps=values.get(names.STEPS_TOTAL, 0.0),
        samples=values.get(names.SAMPLES_TOTAL, 0.0),
        step_sum=values.get(f"{names.STEP_SECONDS}_sum", 0.0),
        step_count=values.get(f"{names.STEP_SECONDS}_count", 0.0),
        step_buckets=tuple(sorted(buckets)),
        phase_sums=phases,
        checkpoint_step=values.get(names.LAST_CHECKPOINT_STEP, 0.0),
        checkpoint_time=values.get(names.LAST_CHECKPOINT_TIMESTAMP_SECONDS, 0.0),
        save_seconds=values.get(names.CHECKPOINT_SAVE_SECONDS, 0.0),
        restart_count=int(values.get(names.RESTART_COUNT, 0.0)),
        restart_reason=reason,
    )


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated within its bucket as Prometheus does."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower_bound  # in the +Inf bucket: the highest finite bound is all we know
            if count == lower_count:
                return upper
            return lower_bound + (upper - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = upper, count
    return lower_bound


# ---------------------------------------------------------------------------------------------
# Scrapes of a whole job


@dataclass(frozen=True, kw_only=True)
class Target:
    """One process to scrape: its global rank, the pod and node it runs on, its /metrics URL."""

    rank: int
    pod: str
    node: str
    url: str


@dataclass(frozen=True, kw_only=True)
class Scrape:
    """One poll of every rank of one attempt."""

    at: datetime
    attempt: int
    targets: tuple[Target, ...]
    ranks: Mapping[int, RankSample]
    """The ranks that answered."""
    errors: Mapping[int, str] = field(default_factory=dict)
    """The ranks that did not, and why (timeout, connection refused...)."""


@dataclass(frozen=True, kw_only=True)
class RankProgress:
    rank: int
    pod: str
    node: str = ""
    step: int | None = None
    step_seconds: float | None = None
    """Mean wall time of a step over the window (the same on every rank: DDP is in lockstep)."""
    work_seconds: float | None = None
    """Mean time per step of the phases the rank does alone: data, forward, optimizer."""
    error: str = ""
    """Why the last poll got no answer from this rank; empty when it answered."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "pod": self.pod}
        if self.node:
            out["node"] = self.node
        for key, value in (("step", self.step), ("stepSeconds", self.step_seconds), ("workSeconds", self.work_seconds)):
            if value is not None:
                out[key] = value
        if self.error:
            out["error"] = self.error
        return out

    @staticmethod
    def parse(raw: Mapping[str, Any]) -> RankProgress:
        return RankProgress(
            rank=_int(raw.get("rank")) or 0,
            pod=str(raw.get("pod") or ""),
            node=str(raw.get("node") or ""),
            step=_int(raw.get("step")),
            step_seconds=_float(raw.get("stepSeconds")),
            work_seconds=_float(raw.get("workSeconds")),
            error=str(raw.get("error") or ""),
        )


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """A rank seen above the others' median since ``since``; flagged once that lasts the window, and cleared once
    it has stayed back within the factor for the window (since ``recovering``)."""

    rank: int
    since: datetime
    recovering: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class ProgressStatus:
    """``status.progress``: what the last polls saw, plus the little the watchdogs must remember."""

    attempt: int = 0
    joined: int = 0
    """Ranks of this attempt that reported their process group ready (ever, in this attempt)."""
    world_size: int = 0
    step: int | None = None
    total_steps: int | None = None
    """The step the run ends at, as the ranks said (``ddp_target_step``); None when they do not know."""
    steps_per_second: float | None = None
    """The pace the step advanced at over the window (wall time: checkpoints and data waits count)."""
    samples_per_second: float | None = None
    step_time_p50: float | None = None
    window_seconds: float | None = None
    slowest_rank: int | None = None
    last_progress_time: datetime | None = None
    """When the operator saw the step advance last (in this attempt)."""
    observed_time: datetime | None = None
    ranks: tuple[RankProgress, ...] = ()
    straggler: Straggler | None = None
    final: bool = False
    """The figures are the ranks' own, from their exit messages at the end of the run, not a poll's."""
    silent: tuple[int, ...] = ()
    """Ranks whose program serves no metrics (``silent_ranks``): no longer polled in this attempt."""
    note: str = ""
    """What the figures cannot show, in plain words (the silent ranks)."""
    restarts_in_place: int = 0
    """In-place restarts of this attempt's processes (the ranks' ``ddp_restart_count``) already counted in
    ``status.restarts``."""

    def to_dict(self, *, running: bool = True) -> dict[str, Any]:
        """``running``: whether the job is Running; an ETA is written only then (not while it restarts, is
        suspended or has finished: the pace of a window past is no forecast)."""
        out: dict[str, Any] = {"attempt": self.attempt, "joined": self.joined, "worldSize": self.world_size}
        if self.final:
            out["final"] = True
        left = eta.seconds_left(self.step, self.total_steps, self.steps_per_second) if running else None
        optional: dict[str, Any] = {
            "step": self.step,
            "totalSteps": self.total_steps,
            "percentDone": eta.percent_done(self.step, self.total_steps),
            "stepsPerSecond": self.steps_per_second,
            "etaSeconds": left,
            "eta": eta.human_duration(left),
            "samplesPerSecond": self.samples_per_second,
            "stepTimeSeconds": self.step_time_p50,
            "stepTime": human_seconds(self.step_time_p50),
            "windowSeconds": self.window_seconds,
            "slowestRank": self.slowest_rank,
            "lastProgressTime": from_time(self.last_progress_time),
            "observedTime": from_time(self.observed_time),
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        if self.ranks:
            out["ranks"] = [r.to_dict() for r in self.ranks]
        if self.straggler:
            out["straggler"] = {"rank": self.straggler.rank, "since": from_time(self.straggler.since)}
            if self.straggler.recovering:
                out["straggler"]["recoveringSince"] = from_time(self.straggler.recovering)
        if self.silent:
            out["silentRanks"] = list(self.silent)
        if self.note:
            out["note"] = self.note
        if self.restarts_in_place:
            out["restartsInPlace"] = self.restarts_in_place
        return out

    @staticmethod
    def parse(raw: Any) -> ProgressStatus | None:
        if not isinstance(raw, Mapping):
            return None
        straggler = raw.get("straggler")
        since = to_time(straggler.get("since")) if isinstance(straggler, Mapping) else None
        return ProgressStatus(
            attempt=_int(raw.get("attempt")) or 0,
            joined=_int(raw.get("joined")) or 0,
            world_size=_int(raw.get("worldSize")) or 0,
            step=_int(raw.get("step")),
            total_steps=_int(raw.get("totalSteps")),
            steps_per_second=_float(raw.get("stepsPerSecond")),
            samples_per_second=_float(raw.get("samplesPerSecond")),
            step_time_p50=_float(raw.get("stepTimeSeconds")),
            window_seconds=_float(raw.get("windowSeconds")),
            slowest_rank=_int(raw.get("slowestRank")),
            last_progress_time=to_time(raw.get("lastProgressTime")),
            observed_time=to_time(raw.get("observedTime")),
            final=raw.get("final") is True,
            silent=tuple(r for r in raw.get("silentRanks") or [] if isinstance(r, int)),
            note=str(raw.get("note") or ""),
            restarts_in_place=_int(raw.get("restartsInPlace")) or 0,
            ranks=tuple(RankProgress.parse(r) for r in raw.get("ranks") or [] if isinstance(r, Mapping)),
            straggler=(
                Straggler(
                    rank=_int(straggler.get("rank")) or 0,
                    since=since,
                    recovering=to_time(straggler.get("recoveringSince")),
                )
                if isinstance(straggler, Mapping) and since
                else None
            ),
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def human_seconds(seconds: float | None) -> str | None:
    """39ms, 1.25s: for the STEP-TIME column."""
    if seconds is None:
        return None
    if seconds < 1:
        return f"{seconds * 1000:.3g}ms"
    return f"{seconds:.3g}s"


# ---------------------------------------------------------------------------------------------
# From scrapes to figures


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """``status.lastCheckpoint``: the newest complete checkpoint the ranks reported, kept across attempts."""

    step: int
    time: datetime | None = None
    save_seconds: float | None = None
    """How long its save took, every rank's part included (None: resumed from, not saved, by what was seen)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step}
        if self.time is not None:
            out["time"] = from_time(self.time)
        if self.save_seconds is not None:
            out["saveSeconds"] = self.save_seconds
        return out

    @staticmethod
    def parse(raw: Any) -> Checkpoint | None:
        if not isinstance(raw, Mapping) or _int(raw.get("step")) is None:
            return None
        return Checkpoint(step=_int(raw.get("step")) or 0, time=to_time(raw.get("time")),
                          save_seconds=_float(raw.get("saveSeconds")))  # fmt: skip


def newest_checkpoint(samples: Iterable[RankSample], known: Checkpoint | None) -> Checkpoint | None:
    """The newest checkpoint the samples report, or ``known`` if none is newer. A save's time is kept from an
    earlier report of the same step when a later one cannot say (a run that resumed from it)."""
    best = known
    for s in samples:
        step = int(s.checkpoint_step)
        if step <= 0 or (best is not None and step < best.step):
            continue
        when = from_unix(s.checkpoint_time)
        save = round(s.save_seconds, 3) if s.save_seconds > 0 else None
        same = best is not None and best.step == step
        best = Checkpoint(
            step=step,
            time=when or (best.time if same and best else None),
            save_seconds=max(filter(None, (save, best.save_seconds if same and best else None)), default=None),
        )
    return best


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The figures of one window of scrapes."""

    at: datetime
    joined: frozenset[int]
    step: int | None
    total_steps: int | None
    """The step the run ends at, from the newest answers that say it."""
    steps_per_second: float | None
    """How fast the step advanced over the window (the fastest rank's pace: they train in lockstep)."""
    samples_per_second: float | None
    step_time_p50: float | None
    window_seconds: float
    ranks: tuple[RankProgress, ...]
    recent_work: Mapping[int, float]
    """Each rank's work seconds per step between its last two answers (what the straggler rule reads)."""
    latest: tuple[RankSample, ...] = ()
    """Each rank's newest answer in the window."""
    restart_count: int = 0
    """The most in-place restarts of the gang's processes any answer of this attempt reported."""
    restart_reason: str = ""
    """Why the last of them happened, as that answer said."""

    @property
    def slowest_rank(self) -> int | None:
        timed = [(r.work_seconds, r.rank) for r in self.ranks if r.work_seconds is not None]
        return max(timed)[1] if timed else None


def _answers(scrapes: Sequence[Scrape], rank: int) -> list[tuple[datetime, RankSample]]:
    return [(s.at, s.ranks[rank]) for s in scrapes if rank in s.ranks]


@dataclass(frozen=True, kw_only=True)
class _RankWindow:
    """One rank's answers within the window, reduced to what the job's figures add up."""

    progress: RankProgress
    last: RankSample
    """Its newest answer."""
    reached: float
    target: float | None
    rate: float | None
    """Samples per second over the window; None with fewer than two answers."""
    step_rate: float | None
    """Steps per second over the window; None with fewer than two answers."""
    buckets: tuple[tuple[float, float], ...]
    recent_work: float | None
    """Work seconds per step between its last two answers."""


def _rank_window(target: Target, answers: list[tuple[datetime, RankSample]], error: str) -> _RankWindow:
    (first_at, first), (last_at, last) = answers[0], answers[-1]
    window = last.minus(first if len(answers) > 1 else None)
    span = (last_at - first_at).total_seconds()
    latest = last.minus(answers[-2][1] if len(answers) > 1 else None)
    timed = window.step_count > 0
    # The pace from the steps this process did (ddp_steps_total), not from ddp_step: a resumed run's ddp_step
    # jumps from 0 to its checkpoint's step at its first step. A program without the counter: from ddp_step.
    done = window.steps if last.steps > 0 else last.reached - first.reached
    return _RankWindow(
        progress=RankProgress(
            rank=target.rank,
            pod=target.pod,
            node=target.node,
            step=int(last.reached),
            step_seconds=_round(window.step_sum / window.step_count) if timed else None,
            work_seconds=_round(window.work_sum / window.step_count) if timed else None,
            error=error,
        ),
        last=last,
        reached=last.reached,
        target=last.target,
        rate=window.samples / span if len(answers) > 1 and span > 0 else None,
        step_rate=done / span if len(answers) > 1 and span > 0 else None,
        buckets=window.step_buckets,
        recent_work=latest.work_sum / latest.step_count if latest.step_count > 0 else None,
    )


def step_since_restart(scrapes: Sequence[Scrape], restarts: int, window_seconds: float = WINDOW_SECONDS) -> int | None:
    """The step that the processes started by ``restarts`` in-place restarts or more reached: as ``summarize``
    takes it (each rank's last answer in the window, the furthest of them), from those processes' answers alone;
    None until one answers."""
    if not scrapes:
        return None
    latest = scrapes[-1]
    last: dict[int, float] = {}
    for s in scrapes:
        if (latest.at - s.at).total_seconds() <= window_seconds:
            last.update({rank: a.reached for rank, a in s.ranks.items() if a.restart_count >= restarts})
    found = [last[t.rank] for t in latest.targets if t.rank in last]
    return int(max(found)) if found else None


def summarize(scrapes: Sequence[Scrape], window_seconds: float = WINDOW_SECONDS) -> Summary | None:
    """Figures over the scrapes of the last ``window_seconds`` (oldest first, one attempt); None if none."""
    if not scrapes:
        return None
    latest = scrapes[-1]
    recent = [s for s in scrapes if (latest.at - s.at).total_seconds() <= window_seconds]
    ranks: list[RankProgress] = []
    windows: list[_RankWindow] = []
    for target in sorted(latest.targets, key=lambda t: t.rank):
        answers = _answers(recent, target.rank)
        if answers:
            windows.append(_rank_window(target, answers, latest.errors.get(target.rank, "")))
            ranks.append(windows[-1].progress)
        else:
            ranks.append(RankProgress(rank=target.rank, pod=target.pod, node=target.node,
                                      error=latest.errors.get(target.rank, "no answer")))  # fmt: skip
    merged: dict[float, float] = {}
    for le, n in (bucket for w in windows for bucket in w.buckets):
        merged[le] = merged.get(le, 0.0) + n
    p50 = quantile(0.5, sorted(merged.items()))
    rates = [w.rate for w in windows if w.rate is not None]
    targets = [w.target for w in windows if w.target is not None]
    paces = [w.step_rate for w in windows if w.step_rate is not None]
    samples = (sample for s in scrapes for sample in s.ranks.values())
    restarted = max(samples, key=lambda r: r.restart_count, default=RankSample())
    return Summary(
        at=latest.at,
        joined=joined_ranks(scrapes),
        step=int(max(w.reached for w in windows)) if windows else None,
        total_steps=int(max(targets)) if targets else None,
        steps_per_second=float(f"{max(paces):.4g}") if paces else None,
        samples_per_second=round(sum(rates), 1) if rates else None,
        step_time_p50=_round(p50) if p50 is not None else None,
        window_seconds=round((latest.at - recent[0].at).total_seconds(), 1),
        ranks=tuple(ranks),
        recent_work={w.progress.rank: w.recent_work for w in windows if w.recent_work is not None},
        latest=tuple(w.last for w in windows),
        restart_count=restarted.restart_count,
        restart_reason=restarted.restart_reason,
    )


def _round(seconds: float) -> float:
    return round(seconds, 4)


def straggler_candidate(work: Mapping[int, float], factor: float) -> tuple[int, float, float] | None:
    """The rank whose work time exceeds ``factor`` x the median of the others: (rank, its time, median)."""
    if len(work) < 2:
        return None
    rank = max(work, key=lambda r: (work[r], -r))
    others = statistics.median(v for r, v in work.items() if r != rank)
    if work[rank] > factor * others and work[rank] - others > MIN_EXCESS_SECONDS:
        return rank, work[rank], others
    return None


def silent_ranks(scrapes: Sequence[Scrape], answered_before: Iterable[int]) -> frozenset[int]:
    """Ranks never answered, asked at least SILENT_TRIES times over SILENT_SECONDS (one attempt's polls).

    A program that serves no /metrics (the textbook script) refuses every poll; ours serves within
    seconds of starting, so most of a minute of refusals is not a slow start.
    """
    answered = set(answered_before)
    asked: dict[int, list[datetime]] = {}
    for scrape in scrapes:
        answered.update(scrape.ranks)
        for target in scrape.targets:
            if target.rank not in scrape.ranks:
                asked.setdefault(target.rank, []).append(scrape.at)
    return frozenset(
        rank
        for rank, at in asked.items()
        if rank not in answered and len(at) >= SILENT_TRIES and (at[-1] - at[0]).total_seconds() >= SILENT_SECONDS
    )


def joined_ranks(scrapes: Iterable[Scrape]) -> frozenset[int]:
    return frozenset(r for s in scrapes for r, sample in s.ranks.items() if sample.ready)


def fresh(old: ProgressStatus | None, attempt: int, world_size: int) -> ProgressStatus:
    """The progress to build on: the old one if it is of this attempt, else an empty one."""
    if old is not None and old.attempt == attempt:
        return replace(old, world_size=world_size)
    return ProgressStatus(attempt=attempt, world_size=world_size)
