"""Training progress end to end in the box: real 2-rank gloo DDP training under the operator, which
polls each rank's /metrics by direct HTTP to the pod IP.

- a slow rank is flagged by StragglerDetected (condition and Event naming the pod and its node)
  within the window, and cleared once the slowdown stops;
- a SIGSTOPped rank makes the job restart with reason NoProgress before the collective timeout;
- `kubectl get ddpj` shows STEP, IMG/S and STEP-TIME during training, with PROGRESS and ETA columns;
- `ddpjob report` writes PNGs of the expected series, from Prometheus and from the ranks;
- on a finished run its plots end at completion and its throughput peaks at what the trainer measured.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ddpjob_box.kubenode.node import KubeletNode
from ddpjob_box.prometheus import SCRAPE_SECONDS, Prometheus
from ddpjob_operator import report
from tests.e2e.conftest import REPO, Kubectl, OperatorProcess
from tests.e2e.jobs import cpu_job
from tests.e2e.kube import Jobs, summary_samples_per_second, table, wait_for

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 300  # the trainer's default collective timeout, stated in the jobs below


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def jobs(api_client: Any, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(api_client, namespace)


def test_a_slow_rank_is_flagged_within_the_window_and_cleared_after_the_slowdown_stops(
    jobs: Jobs, kubectl: Kubectl, namespace: str
) -> None:
    window = 12
    args = ["--steps", "100000", "--slow-rank", "1", "--slow-seconds", "0.25", "--slow-until-step", "150",
            "--pg-timeout-seconds", str(PG_TIMEOUT)]  # fmt: skip
    jobs.create(cpu_job("straggle", args=args, straggler={"factor": 3, "windowSeconds": window}))
    running = jobs.wait_running("straggle", 240)
    assert running["progress"]["joined"] == 2

    def columns() -> dict[str, str] | None:
        # cut by the header's columns: an empty cell (QUEUE, for a job without a Kueue queue) is one too
        (row,) = table(kubectl("get", "ddpj", "straggle", "-n", namespace).stdout)
        return row if row.get("STEP", "").isdigit() and int(row["STEP"]) > 0 and row.get("IMG/S") else None

    row = wait_for("kubectl get ddpj to show STEP, IMG/S and STEP-TIME", columns, 60, interval=2)
    assert list(row) == ["NAME", "PHASE", "READY", "RESTARTS", "STEP", "IMG/S", "STEP-TIME", "PROGRESS", "ETA",
                         "QUEUE", "AGE"]  # fmt: skip
    assert row["QUEUE"] == "", "a job without the kueue.x-k8s.io/queue-name label has nothing in QUEUE"
    assert row["PHASE"] == "Running" and float(row["IMG/S"]) > 0
    # 300ms, or 1.75s on a loaded machine (CI's): a slowed step is over 0.25 s, so its unit depends on the load
    assert re.fullmatch(r"\d+(\.\d+)?(ms|s)", row["STEP-TIME"]), row

    flagged = wait_for(
        "StragglerDetected",
        lambda: (c := jobs.condition("straggle", "StragglerDetected")) and c["status"] == "True" and c,
        120,
        interval=1,
    )
    node = jobs.pod("straggle-1").spec.node_name
    assert flagged["message"].startswith(f"rank 1 (pod straggle-1 on node {node}) works ")
    status = jobs.status("straggle")
    since = _time(status["progress"]["straggler"]["since"])
    # within the window: flagged once rank 1 has stayed slow for the window, at the next poll
    assert (_time(flagged["lastTransitionTime"]) - since).total_seconds() <= window + window / 4 + 1
    assert status["progress"]["slowestRank"] == 1
    (event,) = jobs.wait_events("straggle", "StragglerDetected")
    assert event.type == "Warning" and f"pod straggle-1 on node {node}" in event.message

    cleared = wait_for(
        "StragglerDetected to clear after step 150",
        lambda: (c := jobs.condition("straggle", "StragglerDetected")) and c["status"] == "False" and c,
        150,
        interval=1,
    )
    assert cleared["reason"] == "StragglerRecovered" and cleared["message"].startswith("rank 1 (pod straggle-1")
    assert jobs.status("straggle")["progress"]["step"] > 150
    assert len(jobs.wait_events("straggle", "StragglerRecovered")) == 1


def test_a_sigstopped_rank_restarts_the_gang_with_reason_no_progress_before_the_collective_timeout(
    jobs: Jobs, node: KubeletNode
) -> None:
    args = ["--steps", "100000", "--pg-timeout-seconds", str(PG_TIMEOUT)]
    jobs.create(cpu_job("hang", args=args, progressDeadlineSeconds=15, runPolicy={"backoffLimit": 1}))
    jobs.wait_running("hang", 240)
    wait_for("training to start", lambda: jobs.status("hang").get("progress", {}).get("step", 0) >= 3, 120)
    victim = jobs.pod("hang-1")
    os.kill(jobs.training_pid(node, "hang-1"), signal.SIGSTOP)  # the training process hangs, not its supervisor
    stopped_at = time.monotonic()

    events = wait_for("a NoProgress restart", lambda: jobs.events("hang", "NoProgress"), PG_TIMEOUT, interval=1)
    assert time.monotonic() - stopped_at < PG_TIMEOUT, "the operator acted before the collective timeout"
    message = events[0].message
    assert "no rank advanced its step for 15s (spec.progressDeadlineSeconds=15)" in message
    assert f"not answering: rank 1 (pod hang-1 on node {victim.spec.node_name}: " in message
    status = jobs.status("hang")
    assert (status["restarts"], status["attempt"]) == (1, 1), "counted against backoffLimit"
    jobs.wait_running("hang", 240)  # the next attempt's ranks join and train


def test_ddpjob_report_writes_pngs_of_step_time_phases_and_throughput(
    jobs: Jobs, namespace: str, cluster: Any, prometheus: Prometheus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs.create(cpu_job("rep", args=["--steps", "100000", "--slow-rank", "1", "--slow-seconds", "0.02"]))
    jobs.wait_running("rep", 240)
    wait_for("a few steps in Prometheus", lambda: prometheus.query(
        f'ddp_step{{namespace="{namespace}", ddpjob="rep"}} > 20'), 120, interval=2)  # fmt: skip

    def over_time() -> tuple[report.ReportData, dict[str, Any]] | None:
        """The report once its rate windows (4 scrapes at least) hold two points per rank: a slow start is no bug."""
        now = time.time()
        data = report.from_prometheus(prometheus.url, namespace, "rep", report.Span(start=now - 120, end=now,
                                                                                     finished=False))  # fmt: skip
        figs = report.figures(data)
        lines = figs["step-time"].axes[0].get_lines()
        return (data, figs) if len(lines) == 2 and all(len(line.get_xdata()) >= 2 for line in lines) else None

    data, figs = wait_for("two points per rank in the report's step-time plot", over_time, 120, interval=5)
    _check_figures(figs, tmp_path / "prom", "rep")
    assert data.phases["1"]["forward"] > data.phases["0"]["forward"], "rank 1 sleeps in its forward phase"

    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, "-m", "ddpjob_operator", "report", "rep", "-n", namespace, "-o", str(out),
         "--duration", "6", "--interval", "2"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"DDPJob {namespace}/rep: Running")
    assert "source: endpoints" in proc.stdout and "rank 1 ms per step: data" in proc.stdout
    for name in report.FIGURES:
        _check_png(out / f"rep-{name}.png")
    args = argparse.Namespace(job="rep", namespace=namespace, prometheus=prometheus.url, out=tmp_path / "cli-prom",
                              rate_window=None, duration=0, interval=1)  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    lines = report.report(args)
    assert "source: prometheus" in lines[0] and lines[-1].endswith("rep-throughput.png")


def test_ddpjob_report_on_a_finished_run_ends_at_completion_and_matches_the_trainers_throughput(
    jobs: Jobs, namespace: str, cluster: Any, prometheus: Prometheus, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    jobs.create(cpu_job("done", args=["--steps", "500"]))
    status = jobs.wait_phase("done", "Succeeded", 600)
    measured = summary_samples_per_second(jobs.log("done-0"))

    body = jobs.custom.get_namespaced_custom_object("ddpjob.dev", "v1alpha1", namespace, "ddpjobs", "done")
    span = report.run_span(body, time.time())
    assert span.finished and span.end == _time(status["completionTime"]).timestamp()
    data = report.from_prometheus(prometheus.url, namespace, "done", span)
    assert data.training is not None
    first, last = data.training
    assert 0 < first < last <= span.seconds, "the training lies between the start and the completion"
    fitted = report.rate_window(span.seconds, SCRAPE_SECONDS)  # the scrape interval, as observed
    assert data.rate_window in (fitted, round(last - first, 1)), "fitted, or the training's length: its mean"
    # a window longer than the training: no window fits inside it, so one point per series holds its mean
    whole = report.from_prometheus(prometheus.url, namespace, "done", span, window=10 * span.seconds)
    assert [len(whole.throughput), *map(len, whole.step_time.values())] == [1, 1, 1], "one point per series"
    assert whole.throughput[0][0] == (first + last) / 2 and whole.rate_window == round(last - first, 1)
    assert abs(whole.throughput[0][1] - measured) <= 0.15 * measured, f"{whole.throughput}, the trainer: {measured}"
    figs = report.figures(data)
    # a fast run's training may hold one window or none: a point per rank at least (the test above waits for two)
    _check_figures(figs, tmp_path / "prom", "done", points=1)
    for name in ("step-time", "throughput"):
        ax = figs[name].axes[0]
        assert ax.get_xlim() == (0.0, span.seconds), f"{name}: the x axis runs from the start to completion"
        assert all(first <= x <= last for line in ax.get_lines() for x in line.get_xdata()), "nothing past the run"
    # The plot peaked at 1,115 samples/s where the ranks measured 1,730: smoothed away. The mean of
    # the plotted windows is the run's own mean; the peak exceeds it only as much as the run's speed varied
    # (on a machine busier than its cores, other load makes it vary: there the peak is above the mean).
    # The windows' plain mean is not the whole run's rate when the speed changes (the windows overlap and cover
    # the run unevenly): 17% under in a make test run on 2 busy cores. 25% still fails the plot (36%
    # under); the peak's check is the one against smoothing.
    rates = [v for _, v in data.throughput]
    mean, peak = sum(rates) / len(rates), max(rates)
    assert abs(mean - measured) <= 0.25 * measured, f"mean {mean:.1f} samples/s, the trainer measured {measured:.1f}"
    assert peak >= 0.85 * measured, f"peak {peak:.1f} samples/s, the trainer measured {measured:.1f}: smoothed away"

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    args = argparse.Namespace(job="done", namespace=namespace, prometheus=prometheus.url, out=tmp_path / "cli",
                              rate_window=None, duration=0, interval=1)  # fmt: skip
    (text, *wrote) = report.report(args)
    print(f"{text}\n(the trainer's summary: {measured:.1f} samples/s; plotted mean {mean:.1f}, peak {peak:.1f})")
    assert text.startswith(f"DDPJob {namespace}/done: Succeeded after {span.seconds:.0f} s"), text
    assert f"peak {peak:.1f} samples/s (rate over {data.rate_window:g} s)" in text
    assert [Path(w.removeprefix("wrote ")).name for w in wrote] == [f"done-{f}.png" for f in report.FIGURES]

    # its ranks are gone: the status at once, no 30 s of sampling (into its own directory: the PNGs above stay)
    args.prometheus, args.duration, args.out = None, 30, tmp_path / "cli-status"
    began = time.monotonic()
    (text, *rest) = report.report(args)
    assert time.monotonic() - began < 10 and text.endswith("source: status"), text
    assert rest == [report.NO_PLOTS] and not args.out.exists(), "no PNG of a lone point per rank"
    assert text.startswith(f"DDPJob {namespace}/done: Succeeded after {span.seconds:.0f} s")


def _check_figures(figs: dict[str, Any], out: Path, job: str, *, points: int = 2) -> None:
    """``points``: at least so many per rank (1: a training shorter than one rate window, drawn as its mean)."""
    step = figs["step-time"].axes[0]
    assert sorted(line.get_label() for line in step.get_lines()) == ["rank 0", "rank 1"]
    assert all(len(line.get_xdata()) >= points for line in step.get_lines()), f"{points}+ points per rank"
    phases = figs["phases"].axes[0]
    assert [t.get_text() for t in phases.get_legend().get_texts()] == ["data", "forward", "backward", "optimizer"]
    assert [t.get_text() for t in phases.get_xticklabels()] == ["rank 0", "rank 1"]
    (rate,) = figs["throughput"].axes[0].get_lines()
    assert rate.get_label() == "samples/s (all ranks)" and max(rate.get_ydata()) > 0
    for path in report.write(figs, out, job):
        _check_png(path)


def _check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (800, 450) and len(data) > 10_000, f"{path}: {width}x{height}, {len(data)} bytes"
