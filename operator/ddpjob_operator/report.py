"""`ddpjob report <job>`: PNG plots and a short text summary of a job's training.

Three figures: step time per rank over time, the breakdown of a step by phase per rank, and
throughput. The series come from Prometheus when one is given (``--prometheus URL``: the whole
run), else from the ranks' own /metrics sampled for ``--duration`` seconds (needs the pod IPs to
be reachable: run it in the cluster, e.g. in the operator's pod), else from the job's status
(the last window the operator saw, or the ranks' final figures once the job has finished).
Gathering (``from_*``) is kept apart from drawing (``figures``), which is pure and tested on its own.

The plots read the run as it was: their x axis is the seconds since the job started, they end at
its completion, and Prometheus' rate windows fit the run (``rate_window``): a fixed 30 s window
would smooth a 20-second run into a slow ramp that never reaches its real throughput.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpjob_contract import metrics as names
from ddpjob_contract.status import ConditionType
from ddpjob_operator import progress
from ddpjob_operator.progress import RankSample, Target
from ddpjob_operator.times import to_time

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Point = tuple[float, float]  # (seconds since the job started, value)
FIGURES = ("step-time", "phases", "throughput")
NO_PLOTS = "no plots: the status holds only the ranks' last figures; pass --prometheus URL to plot the whole run"
WORK = "data+forward+optimizer"
"""From the status: what a rank does alone (``status.progress.ranks[].workSeconds``)..."""
REST = "backward (with the wait for peers)"
"""...and the rest of its step."""


@dataclass
class ReportData:
    job: str
    namespace: str
    source: str
    """prometheus, endpoints or status: where the series came from."""
    step_time: dict[str, list[Point]] = field(default_factory=dict)
    """Rank -> seconds per step over time."""
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    """Rank -> phase -> mean seconds per step (from the status: ``WORK`` and ``REST`` only)."""
    throughput: list[Point] = field(default_factory=list)
    """Samples per second, all ranks together, over time."""
    span: Span | None = None
    """The run on the wall clock; the x axes run from its start to its end."""
    rate_window: float | None = None
    """Seconds each Prometheus rate averages over (None: not from Prometheus)."""
    training: tuple[float, float] | None = None
    """The first and the last step, in seconds since the start (shaded on the time axes)."""

    @property
    def phase_names(self) -> list[str]:
        """The trainer's phases in their order, or the two parts the status keeps."""
        seen = {p for by_phase in self.phases.values() for p in by_phase}
        return [p for p in (*names.PHASES, WORK, REST) if p in seen] or list(names.PHASES)


# ---------------------------------------------------------------------------------------------
# The run's span, and Prometheus' windows over it (pure)

DEFAULT_SCRAPE_SECONDS = 15.0
"""Assumed when Prometheus holds too few samples to tell its scrape interval."""
MIN_SCRAPES_PER_WINDOW = 4
"""A rate needs two samples in its window; four leave room for a missed or late scrape."""
RUN_FRACTION_PER_WINDOW = 1 / 20
"""On long runs a window of a twentieth of the run smooths noise without hiding a trend."""
POINTS_PER_PLOT = 240


@dataclass(frozen=True)
class Span:
    """The run on the wall clock (Unix seconds): from the job's start to its completion, or to now."""

    start: float
    end: float
    finished: bool

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def run_span(body: Mapping[str, Any], now: float) -> Span:
    """``status.startTime`` (else the creation) to ``status.completionTime`` (else the moment the
    Succeeded or Failed condition turned True; else ``now``: the job still runs)."""
    status: Mapping[str, Any] = body.get("status") or {}
    created = to_time((body.get("metadata") or {}).get("creationTimestamp"))
    start = to_time(status.get("startTime")) or created
    end = to_time(status.get("completionTime")) or _finished_at(status)
    begin = start.timestamp() if start else now - 3600
    return Span(start=begin, end=max(begin, end.timestamp()) if end else now, finished=end is not None)


def _finished_at(status: Mapping[str, Any]) -> datetime | None:
    for c in status.get("conditions") or []:
        if c.get("type") in (ConditionType.SUCCEEDED, ConditionType.FAILED) and c.get("status") == "True":
            return to_time(c.get("lastTransitionTime"))
    return None


def rate_window(span_seconds: float, scrape_seconds: float) -> float:
    """Whole seconds each rate averages over: at least ``MIN_SCRAPES_PER_WINDOW`` scrapes, and on a long
    run ``RUN_FRACTION_PER_WINDOW`` of it."""
    return float(math.ceil(max(MIN_SCRAPES_PER_WINDOW * scrape_seconds, RUN_FRACTION_PER_WINDOW * span_seconds)))


def promql_duration(seconds: float) -> str:
    """A PromQL duration: whole milliseconds, as PromQL reads no fractions ("1.001s" is a parse error, and a
    scrape interval read off jittered samples is such a number)."""
    return f"{max(1, round(seconds * 1000))}ms"


def query_step(span_seconds: float, scrape_seconds: float) -> float:
    """Seconds between the plotted points: ``POINTS_PER_PLOT`` across the run, but no finer than a
    scrape (finer points only repeat the same samples, drawing stairs)."""
    return max(scrape_seconds, span_seconds / POINTS_PER_PLOT)


def windowed(points: Sequence[Point], window: float, training: tuple[float, float] | None) -> list[Point]:
    """Rates evaluated at t (each the mean over [t - window, t]), drawn at the middle of their window.

    With the first and last step known (``training``, seconds since the start), only the windows
    that lie wholly inside the training are kept: one reaching past either edge would draw a ramp
    the run never had. A training shorter than one window keeps none (``from_prometheus`` then
    draws the training's own mean instead)."""
    inside = [(t, v) for t, v in points if training is None or (training[0] <= t - window and t <= training[1])]
    return [(t - window / 2, v) for t, v in inside]


def scrape_interval(timestamps: Sequence[Sequence[float]]) -> float:
    """Prometheus' scrape interval as its samples show it: the median gap between one series'
    consecutive samples; ``DEFAULT_SCRAPE_SECONDS`` when no series has two."""
    gaps = sorted(b - a for series in timestamps for a, b in itertools.pairwise(series) if b > a)
    return gaps[len(gaps) // 2] if gaps else DEFAULT_SCRAPE_SECONDS


# ---------------------------------------------------------------------------------------------
# Drawing (pure: data in, figures out)


def figures(data: ReportData) -> dict[str, Figure]:
    from matplotlib.figure import Figure

    title = f"{data.namespace}/{data.job} ({data.source})"
    step = Figure(figsize=(8, 4.5))
    ax = step.add_subplot()
    for rank in sorted(data.step_time, key=_rank_order):
        points = data.step_time[rank]
        ax.plot([t for t, _ in points], [v * 1000 for _, v in points], marker="." if len(points) < 3 else None,
                label=f"rank {rank}")  # fmt: skip
    ax.set(title=f"Step time per rank: {title}", ylabel="ms per step")
    _time_axis(ax, data)

    phases = Figure(figsize=(8, 4.5))
    ax = phases.add_subplot()
    ranks = sorted(data.phases, key=_rank_order)
    bottom = [0.0] * len(ranks)
    for phase in data.phase_names:
        heights = [data.phases[r].get(phase, 0.0) * 1000 for r in ranks]
        ax.bar([f"rank {r}" for r in ranks], heights, bottom=bottom, label=phase)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set(title=f"Time per step by phase: {title}", ylabel="ms per step")
    _legend(ax)

    rate = Figure(figsize=(8, 4.5))
    ax = rate.add_subplot()
    ax.plot([t for t, _ in data.throughput], [v for _, v in data.throughput],
            marker="." if len(data.throughput) < 3 else None, label="samples/s (all ranks)")  # fmt: skip
    window = f", rate over {data.rate_window:g} s" if data.rate_window else ""
    ax.set(title=f"Throughput: {title}", ylabel=f"samples per second{window}")
    ax.set_ylim(bottom=0)
    _time_axis(ax, data)
    return {"step-time": step, "phases": phases, "throughput": rate}


def _time_axis(ax: Any, data: ReportData) -> None:
    """Seconds since the job started, to its end: nothing is drawn past the run."""
    if data.training:
        ax.axvspan(*data.training, color="0.94", zorder=0, label="training (first to last step)")
    span = data.span
    if span is not None and span.seconds > 0:
        ax.set_xlim(0, span.seconds)
        until = "completion" if span.finished else "now"
        ax.set_xlabel(f"seconds since the job started ({until} at {span.seconds:.0f} s)")
    else:
        ax.set_xlabel("seconds since the job started")
    _legend(ax)


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def write(figs: Mapping[str, Figure], out: Path, job: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figs.items():
        path = out / f"{job}-{name}.png"
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths


def summary(data: ReportData, status: Mapping[str, Any]) -> str:
    """The figures in ``status.progress``: the ranks' own final ones once the operator has them from their
    exit messages (``final``), else the last poll's."""
    prog: Mapping[str, Any] = status.get("progress") or {}
    span = data.span
    ended = f" after {span.seconds:.0f} s" if span and span.finished else ""
    final = prog.get("final") is True
    slowest = f", slowest rank {prog['slowestRank']}" if prog.get("slowestRank") is not None else ""
    lines = [
        f"DDPJob {data.namespace}/{data.job}: {status.get('phase', 'unknown')}{ended}, "
        f"attempt {status.get('attempt', 0)}, {status.get('restarts', 0)} restarts",
        f"  {'final' if final else 'last poll'}: step {prog.get('step', '-')}, {prog.get('samplesPerSecond', '-')} "
        f"samples/s, {'mean step time' if final else 'step time p50'} {prog.get('stepTime', '-')}{slowest}",
    ]
    for c in status.get("conditions") or []:
        if c.get("type") in ("StragglerDetected", "Restarting", "Failed") and c.get("status") == "True":
            lines.append(f"  {c['type']}: {c.get('message', '')}")
    for rank in sorted(data.phases, key=_rank_order):
        parts = ", ".join(f"{p} {data.phases[rank].get(p, 0.0) * 1000:.1f}" for p in data.phase_names)
        lines.append(f"  rank {rank} ms per step: {parts}")
    if data.throughput:
        values = [v for _, v in data.throughput]
        window = f" (rate over {data.rate_window:g} s)" if data.rate_window else ""
        lines.append(f"  throughput: mean {sum(values) / len(values):.1f}, peak {max(values):.1f} samples/s{window}")
    lines.append(f"  source: {data.source}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Gathering


def from_prometheus(
    url: str,
    namespace: str,
    job: str,
    span: Span,
    *,
    scrape_seconds: float | None = None,
    window: float | None = None,
) -> ReportData:
    """Series over ``span`` from a Prometheus that labels the ranks' series with namespace, ddpjob and rank.

    The rate window (unless ``window`` says it) and the step between points follow from the run's
    length and the scrape interval, which is read off the samples themselves unless ``scrape_seconds``
    says it. Only the windows that lie wholly inside the training (its first to its last step) are
    drawn; when none does, one point per series holds the training's mean."""
    sel = f'namespace="{namespace}",ddpjob="{job}"'
    if scrape_seconds is None:
        recent = f"{max(1, math.ceil(min(span.seconds, 300)))}s"  # enough scrapes to tell the interval
        raw = _prom(url, "query", f"{names.STEPS_TOTAL}{{{sel}}}[{recent}]", time=span.end)
        scrape_seconds = scrape_interval([[float(t) for t, _ in s.get("values", [])] for s in raw])
    window = window or rate_window(span.seconds, scrape_seconds)
    data = ReportData(job=job, namespace=namespace, source="prometheus", span=span, rate_window=window)
    data.training = training = _training(url, sel, span, scrape_seconds)
    w, step = promql_duration(window), query_step(span.seconds, scrape_seconds)

    def series(promql: str) -> list[tuple[str, list[Point]]]:
        found = _prom(url, "query_range", promql, start=span.start, end=span.end, step=step)
        return [
            (s["metric"].get("rank", "?"), windowed(_points(s["values"], span.start), window, training)) for s in found
        ]

    per_step = (
        f"sum by (rank) (rate({names.STEP_SECONDS}_sum{{{sel}}}[{w}]))"
        f" / sum by (rank) (rate({names.STEP_SECONDS}_count{{{sel}}}[{w}]))"
    )
    data.step_time = dict(series(per_step))
    for _, points in series(f"sum(rate({names.SAMPLES_TOTAL}{{{sel}}}[{w}]))"):
        data.throughput = points
    if training and not data.throughput:  # no window fits inside the training: its mean, one point
        _over_training(url, sel, span, scrape_seconds, data, training)
    data.phases = _phases(url, sel, span)
    return data


def _over_training(
    url: str, sel: str, span: Span, scrape_seconds: float, data: ReportData, training: tuple[float, float]
) -> None:
    """A training shorter than one rate window is drawn as one point per series at its middle: what the
    counters gained from the first scrape that saw a step to the last, over the steps' own timestamps
    (``_training`` reads those from the same two scrapes), so the figure is the run's exact mean."""
    first, last = training
    if last <= first:
        return  # one scrape saw the whole training: no rate to draw
    whole = _whole(span)

    def gained(metric: str) -> str:
        return f"(max_over_time({metric}{{{sel}}}[{whole}]) - {_first_seen(metric, sel, whole, scrape_seconds)})"

    step = names.STEP_SECONDS
    per_step = f"sum by (rank) ({gained(f'{step}_sum')}) / sum by (rank) ({gained(f'{step}_count')})"
    middle = (first + last) / 2
    data.step_time = {
        s["metric"].get("rank", "?"): [(middle, float(s["value"][1]))]
        for s in _prom(url, "query", per_step, time=span.end)
    }
    data.throughput = [
        (middle, float(s["value"][1]) / (last - first))
        for s in _prom(url, "query", f"sum({gained(names.SAMPLES_TOTAL)})", time=span.end)
    ]
    data.rate_window = round(last - first, 1)


def _whole(span: Span) -> str:
    """A PromQL range over the whole span, in whole seconds."""
    return f"{max(1, math.ceil(span.seconds))}s"


def _first_seen(metric: str, sel: str, whole: str, scrape_seconds: float) -> str:
    """The value at the first scrape over ``whole`` that saw it above 0, per series: the first step's scrape
    (``_training`` and ``_over_training`` read the same one)."""
    return f"min_over_time(({metric}{{{sel}}} > 0)[{whole}:{promql_duration(scrape_seconds)}])"


def _training(url: str, sel: str, span: Span, scrape_seconds: float) -> tuple[float, float] | None:
    """When the ranks' first and last steps finished, in seconds since the start (the trainer's gauge
    is 0 until its first step)."""
    whole = _whole(span)
    last = f"max(max_over_time({names.LAST_STEP_TIMESTAMP_SECONDS}{{{sel}}}[{whole}]))"
    first = f"min({_first_seen(names.LAST_STEP_TIMESTAMP_SECONDS, sel, whole, scrape_seconds)})"
    ends = [_prom(url, "query", q, time=span.end) for q in (first, last)]
    if not all(ends):
        return None
    return float(ends[0][0]["value"][1]) - span.start, float(ends[1][0]["value"][1]) - span.start


def _phases(url: str, sel: str, span: Span) -> dict[str, dict[str, float]]:
    """Rank -> phase -> mean seconds per step over the whole span."""
    whole = _whole(span)
    query = f"sum by (rank) (increase({names.STEP_SECONDS}_count{{{sel}}}[{whole}]))"
    steps = {s["metric"].get("rank", "?"): float(s["value"][1]) for s in _prom(url, "query", query, time=span.end)}
    phases: dict[str, dict[str, float]] = {}
    query = f"sum by (rank, phase) (increase({names.PHASE_SECONDS}_sum{{{sel}}}[{whole}]))"
    for s in _prom(url, "query", query, time=span.end):
        rank, phase = s["metric"].get("rank", "?"), s["metric"].get(names.PHASE_LABEL, "?")
        if steps.get(rank):
            phases.setdefault(rank, {})[phase] = float(s["value"][1]) / steps[rank]
    return phases


def _prom(url: str, endpoint: str, promql: str, **params: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": promql, **{k: f"{v:.3f}" for k, v in params.items()}})
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/{endpoint}?{query}", timeout=30) as response:
            body = json.load(response)
    except urllib.error.HTTPError as err:  # a query Prometheus refuses: 400, with the same JSON body saying why
        body = _error_body(err)
    if body.get("status") != "success":
        raise ReportError(f"Prometheus at {url} refused the query {promql!r}: {body.get('error', body)}")
    return list(body["data"]["result"])


def _error_body(err: urllib.error.HTTPError) -> dict[str, Any]:
    """Prometheus' JSON answer to a refused query, or its text as the error when it is not JSON."""
    text = err.read().decode(errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {"status": "error", "error": text or str(err)}


def _points(values: Sequence[Sequence[Any]], start: float) -> list[Point]:
    out = []
    for t, v in values:
        value = float(v)
        if value == value and value not in (float("inf"), float("-inf")):  # NaN before the first step
            out.append((float(t) - start, value))
    return out


def from_endpoints(
    job: str,
    namespace: str,
    targets: Sequence[Target],
    *,
    duration: float,
    interval: float,
    fetch: Callable[[str], str] | None = None,
) -> ReportData:
    """Sample every rank's /metrics every ``interval`` seconds for ``duration``; series from the differences."""
    get = fetch or _http_get
    data = ReportData(job=job, namespace=namespace, source="endpoints")
    samples: list[tuple[float, dict[int, RankSample]]] = []
    began = time.monotonic()
    count = max(2, int(duration // interval) + 1)
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
        for i in range(count):
            if i:
                time.sleep(interval)
            at = time.monotonic() - began
            texts = list(pool.map(lambda t: _try(get, t.url), targets))
            samples.append((at, {t.rank: progress.parse_metrics(x) for t, x in zip(targets, texts, strict=True) if x}))
    for (t0, older), (t1, newer) in itertools.pairwise(samples):
        done = 0.0
        for rank, sample in newer.items():
            delta = sample.minus(older.get(rank))
            done += delta.samples if rank in older else 0.0
            if rank in older and delta.step_count > 0:
                data.step_time.setdefault(str(rank), []).append((t1, delta.step_sum / delta.step_count))
        if t1 > t0:
            data.throughput.append((t1, done / (t1 - t0)))
    if samples:
        for rank, sample in samples[-1][1].items():
            if sample.step_count > 0:
                data.phases[str(rank)] = {p: v / sample.step_count for p, v in sample.phase_sums.items()}
    return data


def _try(get: Callable[[str], str], url: str) -> str:
    try:
        return get(url)
    except (OSError, ValueError):
        return ""


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bytes(response.read(4 * 1024 * 1024)).decode(errors="replace")


def from_status(job: str, namespace: str, status: Mapping[str, Any], span: Span | None = None) -> ReportData:
    """What ``status.progress`` holds (the last window the operator saw, or the final figures): one
    point per series, at the span's end, and work vs the rest of a step per rank."""
    prog: Mapping[str, Any] = status.get("progress") or {}
    data = ReportData(job=job, namespace=namespace, source="status", span=span)
    at = span.seconds if span else 0.0
    for r in prog.get("ranks") or []:
        rank = str(r.get("rank"))
        if isinstance(r.get("stepSeconds"), int | float):
            data.step_time[rank] = [(at, float(r["stepSeconds"]))]
        if isinstance(r.get("stepSeconds"), int | float) and isinstance(r.get("workSeconds"), int | float):
            # a poll keeps work (data + forward + optimizer) and the whole step; the final figures only the step
            work = float(r["workSeconds"])
            data.phases[rank] = {WORK: work, REST: max(0.0, float(r["stepSeconds"]) - work)}
    if isinstance(prog.get("samplesPerSecond"), int | float):
        data.throughput = [(at, float(prog["samplesPerSecond"]))]
    return data


class ReportError(Exception):
    """One line for the user: what is missing and how to fix it."""


# ---------------------------------------------------------------------------------------------
# The command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="the DDPJob's name")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--prometheus", metavar="URL", help="read the whole run from this Prometheus")
    parser.add_argument("-o", "--out", type=Path, default=Path("."), help="directory for the PNGs (default: here)")
    parser.add_argument("--rate-window", type=float, metavar="SECONDS",
                        help="with --prometheus: seconds per rate (default: fitted to the run)")  # fmt: skip
    parser.add_argument("--duration", type=float, default=30.0, help="without Prometheus: sample the ranks this long")
    parser.add_argument("--interval", type=float, default=3.0, help="without Prometheus: seconds between samples")


def run(args: argparse.Namespace) -> int:
    try:
        for line in report(args):
            print(line)
    except ReportError as err:
        print(f"ddpjob report: error: {err}", file=sys.stderr)
        return 2
    return 0


def report(args: argparse.Namespace) -> list[str]:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError("matplotlib is missing: pip install 'ddpjob[operator]'") from None
    from ddpjob_operator.api import SpecError, parse_job
    from ddpjob_operator.kube import Kube
    from ddpjob_operator.progress_fold import poll_targets
    from ddpjob_operator.status import observe, parse_status, pod_view

    kube = Kube()
    try:
        body = kube.get_job(args.namespace, args.job)
        if body is None:
            raise ReportError(f"no DDPJob {args.job!r} in namespace {args.namespace!r}")
        status: Mapping[str, Any] = body.get("status") or {}
        span = run_span(body, time.time())
        if args.prometheus:
            data = from_prometheus(args.prometheus, args.namespace, args.job, span, window=args.rate_window)
        elif span.finished:  # its ranks are gone: the status holds their final figures
            data = from_status(args.job, args.namespace, status, span)
        else:
            try:
                job = parse_job(body)
            except SpecError as err:
                raise ReportError(str(err)) from None
            pods = [pod_view(p, job.spec.trainer_container) for p in kube.list_pods(args.namespace, args.job)]
            current = parse_status(status)
            obs = observe(pods, job_name=job.name, attempt=current.attempt, replicas=job.spec.replicas,
                          spec_hash=job.spec.spec_hash, launched=True)  # fmt: skip
            targets = poll_targets(job, obs)
            data = from_endpoints(args.job, args.namespace, targets, duration=args.duration, interval=args.interval)
            if not data.step_time:
                data = from_status(args.job, args.namespace, status, span)
    except OSError as err:
        raise ReportError(f"cannot reach {args.prometheus or 'the cluster'}: {err}") from None
    finally:
        kube.close()
    if data.source == "status":  # one figure per rank at the end: a plot over time would be a lone dot
        return [summary(data, status), NO_PLOTS]
    paths = write(figures(data), args.out, args.job)
    return [summary(data, status), *(f"wrote {p}" for p in paths)]
