"""`ddpjob report <job>`: PNG plots and a short text summary of a job's training.

Three figures: step time per rank over time, the breakdown of a step by phase per rank, and
throughput. The series come from Prometheus when one is given (``--prometheus URL``: the whole
run), else from the ranks' own /metrics sampled for ``--duration`` seconds (needs the pod IPs to
be reachable: run it in the cluster, e.g. in the operator's pod), else from the job's status
(the last window the operator saw). Gathering (``from_*``) is kept apart from drawing
(``figures``), which is pure and tested on its own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpjob_contract import metrics as names
from ddpjob_operator import progress
from ddpjob_operator.progress import RankSample, Target

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Point = tuple[float, float]  # (seconds since the first sample, value)
FIGURES = ("step-time", "phases", "throughput")
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

    @property
    def phase_names(self) -> list[str]:
        """The trainer's phases in their order, or the two parts the status keeps."""
        seen = {p for by_phase in self.phases.values() for p in by_phase}
        return [p for p in (*names.PHASES, WORK, REST) if p in seen] or list(names.PHASES)

    throughput: list[Point] = field(default_factory=list)
    """Samples per second, all ranks together, over time."""


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
    ax.set(title=f"Step time per rank: {title}", xlabel="seconds", ylabel="ms per step")
    _legend(ax)

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
    ax.set(title=f"Throughput: {title}", xlabel="seconds", ylabel="samples per second")
    _legend(ax)
    return {"step-time": step, "phases": phases, "throughput": rate}


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
    prog: Mapping[str, Any] = status.get("progress") or {}
    lines = [
        f"DDPJob {data.namespace}/{data.job}: {status.get('phase', 'unknown')}, attempt {status.get('attempt', 0)}, "
        f"{status.get('restarts', 0)} restarts",
        f"  step {prog.get('step', '-')}, {prog.get('samplesPerSecond', '-')} samples/s, "
        f"step time p50 {prog.get('stepTime', '-')}, slowest rank {prog.get('slowestRank', '-')}",
    ]
    for c in status.get("conditions") or []:
        if c.get("type") in ("StragglerDetected", "Restarting", "Failed") and c.get("status") == "True":
            lines.append(f"  {c['type']}: {c.get('message', '')}")
    for rank in sorted(data.phases, key=_rank_order):
        parts = ", ".join(f"{p} {data.phases[rank].get(p, 0.0) * 1000:.1f}" for p in data.phase_names)
        lines.append(f"  rank {rank} ms per step: {parts}")
    if data.throughput:
        values = [v for _, v in data.throughput]
        lines.append(f"  throughput: mean {sum(values) / len(values):.1f}, max {max(values):.1f} samples/s")
    lines.append(f"  source: {data.source}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Gathering


def from_prometheus(
    url: str, namespace: str, job: str, start: float, end: float, *, rate_window: str = "30s"
) -> ReportData:
    """Series over [start, end] from a Prometheus that labels the ranks' series with namespace, ddpjob and rank."""
    sel = f'namespace="{namespace}",ddpjob="{job}"'
    step = max(2.0, (end - start) / 300)
    data = ReportData(job=job, namespace=namespace, source="prometheus")
    per_step = (
        f"sum by (rank) (rate({names.STEP_SECONDS}_sum{{{sel}}}[{rate_window}]))"
        f" / sum by (rank) (rate({names.STEP_SECONDS}_count{{{sel}}}[{rate_window}]))"
    )
    for series in _prom(url, "query_range", per_step, start=start, end=end, step=step):
        data.step_time[series["metric"].get("rank", "?")] = _points(series["values"], start)
    rate = f"sum(rate({names.SAMPLES_TOTAL}{{{sel}}}[{rate_window}]))"
    for series in _prom(url, "query_range", rate, start=start, end=end, step=step):
        data.throughput = _points(series["values"], start)
    span = f"{max(1, int(end - start) + 1)}s"
    steps = {
        s["metric"].get("rank", "?"): float(s["value"][1])
        for s in _prom(url, "query", f"sum by (rank) (increase({names.STEP_SECONDS}_count{{{sel}}}[{span}]))", time=end)
    }
    query = f"sum by (rank, phase) (increase({names.PHASE_SECONDS}_sum{{{sel}}}[{span}]))"
    for s in _prom(url, "query", query, time=end):
        rank, phase = s["metric"].get("rank", "?"), s["metric"].get(names.PHASE_LABEL, "?")
        if steps.get(rank):
            data.phases.setdefault(rank, {})[phase] = float(s["value"][1]) / steps[rank]
    return data


def _prom(url: str, endpoint: str, promql: str, **params: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": promql, **{k: f"{v:.3f}" for k, v in params.items()}})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/{endpoint}?{query}", timeout=30) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise ReportError(f"Prometheus at {url} refused the query: {body.get('error', body)}")
    return list(body["data"]["result"])


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


def from_status(job: str, namespace: str, status: Mapping[str, Any]) -> ReportData:
    """The last window the operator saw: one point per series, and work vs the rest of a step per rank."""
    prog: Mapping[str, Any] = status.get("progress") or {}
    data = ReportData(job=job, namespace=namespace, source="status")
    for r in prog.get("ranks") or []:
        rank = str(r.get("rank"))
        if isinstance(r.get("stepSeconds"), int | float):
            data.step_time[rank] = [(0.0, float(r["stepSeconds"]))]
            work = float(r.get("workSeconds") or 0.0)
            # the status keeps only work (data + forward + optimizer) and the whole step
            data.phases[rank] = {WORK: work, REST: max(0.0, float(r["stepSeconds"]) - work)}
    if isinstance(prog.get("samplesPerSecond"), int | float):
        data.throughput = [(0.0, float(prog["samplesPerSecond"]))]
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
    from ddpjob_operator.lifecycle import poll_targets
    from ddpjob_operator.status import observe, parse_status, pod_view
    from ddpjob_operator.times import to_time

    kube = Kube()
    try:
        body = kube.get_job(args.namespace, args.job)
        if body is None:
            raise ReportError(f"no DDPJob {args.job!r} in namespace {args.namespace!r}")
        status: Mapping[str, Any] = body.get("status") or {}
        if args.prometheus:
            meta = body["metadata"]
            start = to_time(meta.get("creationTimestamp"))
            end = to_time(status.get("completionTime"))
            data = from_prometheus(
                args.prometheus, args.namespace, args.job,
                start.timestamp() if start else time.time() - 3600, end.timestamp() if end else time.time(),
            )  # fmt: skip
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
                data = from_status(args.job, args.namespace, status)
    except OSError as err:
        raise ReportError(f"cannot reach {args.prometheus or 'the cluster'}: {err}") from None
    finally:
        kube.close()
    paths = write(figures(data), args.out, args.job)
    return [summary(data, status), *(f"wrote {p}" for p in paths)]
