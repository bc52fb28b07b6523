"""`ddpjob report`: the figures hold the expected series, the PNGs are real images, the summary reads well."""

from __future__ import annotations

import http.server
import json
import re
import threading
from pathlib import Path

import pytest

from ddpjob_operator import report
from ddpjob_operator.progress import Target
from ddpjob_operator.report import ReportData

from .test_progress import trainer_text


def data() -> ReportData:
    return ReportData(
        job="train",
        namespace="ns",
        source="prometheus",
        step_time={"0": [(0.0, 0.030), (10.0, 0.031)], "1": [(0.0, 0.030), (10.0, 0.032)]},
        phases={
            "0": {"data": 0.001, "forward": 0.01, "backward": 0.018, "optimizer": 0.001},
            "1": {"data": 0.001, "forward": 0.02, "backward": 0.008, "optimizer": 0.001},
        },
        throughput=[(0.0, 1000.0), (10.0, 1040.0)],
    )


def test_the_figures_hold_one_line_per_rank_one_bar_per_phase_and_the_throughput() -> None:
    figs = report.figures(data())
    assert list(figs) == list(report.FIGURES)
    step = figs["step-time"].axes[0]
    assert [line.get_label() for line in step.get_lines()] == ["rank 0", "rank 1"]
    assert list(step.get_lines()[1].get_ydata()) == pytest.approx([30.0, 32.0]), "milliseconds"
    phases = figs["phases"].axes[0]
    assert [t.get_text() for t in phases.get_legend().get_texts()] == ["data", "forward", "backward", "optimizer"]
    assert len(phases.patches) == 8, "4 phases stacked on 2 ranks"
    (rate,) = figs["throughput"].axes[0].get_lines()
    assert rate.get_label() == "samples/s (all ranks)" and list(rate.get_ydata()) == [1000.0, 1040.0]


def test_the_pngs_are_non_empty_images(tmp_path: Path) -> None:
    paths = report.write(report.figures(data()), tmp_path, "train")
    assert [p.name for p in paths] == ["train-step-time.png", "train-phases.png", "train-throughput.png"]
    for path in paths:
        raw = path.read_bytes()
        assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 10_000
        assert (int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")) == (800, 450)


def test_sampling_the_ranks_endpoints_gives_series_from_the_differences() -> None:
    pages = {
        0: iter([trainer_text(n) for n in (10, 20, 30)]),
        1: iter([trainer_text(n, work=0.03) for n in (10, 20, 30)]),
    }
    targets = [Target(rank=r, pod=f"train-{r}", node="n", url=str(r)) for r in (0, 1)]
    got = report.from_endpoints("train", "ns", targets, duration=0.02, interval=0.01,
                                fetch=lambda url: next(pages[int(url)]))  # fmt: skip
    assert sorted(got.step_time) == ["0", "1"] and len(got.step_time["0"]) == 2
    assert got.step_time["1"][0][1] == pytest.approx(0.05), "30 ms of work + 20 ms of backward per step"
    assert got.phases["1"]["forward"] == pytest.approx(0.015) and got.phases["0"]["backward"] == pytest.approx(0.02)
    assert all(v > 0 for _, v in got.throughput)


def test_without_prometheus_or_endpoints_the_status_still_gives_a_report() -> None:
    status = {"phase": "Succeeded", "progress": {"samplesPerSecond": 812.5, "stepTime": "39ms", "step": 100,
              "ranks": [{"rank": 0, "pod": "p-0", "stepSeconds": 0.04, "workSeconds": 0.01}]}}  # fmt: skip
    got = report.from_status("train", "ns", status)
    assert got.step_time == {"0": [(0.0, 0.04)]} and got.throughput == [(0.0, 812.5)]
    text = report.summary(got, status)
    assert text.startswith("DDPJob ns/train: Succeeded") and "step 100, 812.5 samples/s, step time p50 39ms" in text
    assert "source: status" in text
    assert got.phases == {"0": {report.WORK: 0.01, report.REST: pytest.approx(0.03)}}
    assert "rank 0 ms per step: data+forward+optimizer 10.0, backward (with the wait for peers) 30.0" in text
    legend = report.figures(got)["phases"].axes[0].get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == [report.WORK, report.REST]


def _job(status: dict[str, object]) -> dict[str, object]:
    return {"metadata": {"name": "train", "creationTimestamp": "2025-01-01T00:00:00Z"}, "status": status}


T0 = 1735689600.0  # 2025-01-01T00:00:00Z
NOW = T0 + 1000


@pytest.mark.parametrize(
    ("status", "span"),
    [
        pytest.param({}, report.Span(T0, NOW, finished=False), id="not-started-yet: creation to now"),
        pytest.param(
            {"startTime": "2025-01-01T00:00:05Z"}, report.Span(T0 + 5, NOW, False), id="running: start to now"
        ),
        pytest.param(
            {"startTime": "2025-01-01T00:00:05Z", "completionTime": "2025-01-01T00:00:27Z"},
            report.Span(T0 + 5, T0 + 27, True),
            id="finished: start to completionTime",
        ),
        pytest.param(
            {
                "startTime": "2025-01-01T00:00:05Z",
                "conditions": [
                    {"type": "Running", "status": "True", "lastTransitionTime": "2025-01-01T00:00:09Z"},
                    {"type": "Failed", "status": "True", "lastTransitionTime": "2025-01-01T00:00:40Z"},
                ],
            },
            report.Span(T0 + 5, T0 + 40, True),
            id="no completionTime: the Failed condition's transition",
        ),
        pytest.param(
            {"conditions": [{"type": "Succeeded", "status": "False", "lastTransitionTime": "2025-01-01T00:00:40Z"}]},
            report.Span(T0, NOW, False),
            id="a condition that is not True does not end the run",
        ),
        pytest.param(
            {"startTime": "2025-01-01T00:00:05Z", "completionTime": "2025-01-01T00:00:01Z"},
            report.Span(T0 + 5, T0 + 5, True),
            id="a completion before the start (skewed clocks) gives an empty span, not a negative one",
        ),
    ],
)
def test_the_run_spans_its_start_to_its_completion(status: dict[str, object], span: report.Span) -> None:
    assert report.run_span(_job(status), NOW) == span


@pytest.mark.parametrize(
    ("run_seconds", "scrape_seconds", "window", "step"),
    [
        pytest.param(20, 2, 8, 2, id="the issue's 20 s run, scraped every 2 s: 4 scrapes, a point per scrape"),
        pytest.param(20, 15, 60, 15, id="a 20 s run scraped every 15 s: still 4 scrapes, though longer than the run"),
        pytest.param(300, 2, 15, 2, id="5 minutes: a twentieth of the run, a point per scrape"),
        pytest.param(3600, 10, 180, 15, id="an hour at 10 s: a twentieth, 240 points"),
        pytest.param(86400, 15, 4320, 360, id="a day: 72 min windows, 240 points"),
        pytest.param(21.3, 3.3, 14, 3.3, id="windows are whole seconds, rounded up"),
    ],
)
def test_rate_windows_fit_the_run_and_the_scrape_interval(
    run_seconds: float, scrape_seconds: float, window: float, step: float
) -> None:
    assert report.rate_window(run_seconds, scrape_seconds) == window
    assert report.query_step(run_seconds, scrape_seconds) == pytest.approx(step)


@pytest.mark.parametrize(
    ("timestamps", "interval"),
    [
        pytest.param([[0, 2, 4, 6, 8]], 2, id="one series"),
        pytest.param([[0, 2, 4, 9, 11], [1, 3, 5]], 2, id="a missed scrape does not stretch it"),
        pytest.param([[5]], report.DEFAULT_SCRAPE_SECONDS, id="one sample: the default"),
        pytest.param([], report.DEFAULT_SCRAPE_SECONDS, id="no series: the default"),
    ],
)
def test_the_scrape_interval_is_read_off_the_samples(timestamps: list[list[float]], interval: float) -> None:
    assert report.scrape_interval(timestamps) == interval


def test_a_finished_runs_axes_end_at_completion_in_seconds_since_the_start() -> None:
    finished = data()
    finished.span = report.Span(T0, T0 + 22, finished=True)
    for name in ("step-time", "throughput"):
        ax = report.figures(finished)[name].axes[0]
        assert ax.get_xlim() == (0.0, 22.0)
        assert ax.get_xlabel() == "seconds since the job started (completion at 22 s)"


FINAL = {"final": True, "step": 500, "samplesPerSecond": 1731.0, "stepTime": "18ms",
         "ranks": [{"rank": 0, "pod": "train-0", "step": 500, "stepSeconds": 0.018}]}  # fmt: skip


@pytest.mark.parametrize(
    ("progress", "line"),
    [
        pytest.param(FINAL, "  final: step 500, 1731.0 samples/s, mean step time 18ms", id="the ranks' exit summaries"),
        pytest.param(
            {"step": 487, "samplesPerSecond": 1502.5, "stepTime": "21ms", "slowestRank": 1},
            "  last poll: step 487, 1502.5 samples/s, step time p50 21ms, slowest rank 1",
            id="no exit summaries (another program): said to be the last poll's",
        ),
    ],
)
def test_a_finished_jobs_summary_says_whether_its_figures_are_final_and_how_long_it_ran(
    progress: dict[str, object], line: str
) -> None:
    status = {"phase": "Succeeded", "progress": progress}
    text = report.summary(report.from_status("train", "ns", status, report.Span(T0, T0 + 21.4, True)), status)
    assert text.startswith("DDPJob ns/train: Succeeded after 21 s, attempt 0, 0 restarts")
    assert line in text.splitlines()


def test_the_final_figures_sit_at_the_end_of_the_span_and_claim_no_phases() -> None:
    got = report.from_status("train", "ns", {"progress": FINAL}, report.Span(T0, T0 + 21, finished=True))
    assert got.throughput == [(21.0, 1731.0)] and got.step_time == {"0": [(21.0, 0.018)]}
    assert got.phases == {}, "an exit summary has no split of the step: no bar of zeros"


RATES = [(t, 100.0) for t in (10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0)]  # evaluated at t: the mean over [t - w, t]


@pytest.mark.parametrize(
    ("training", "window", "drawn_at"),
    [
        pytest.param((9.0, 21.0), 4, [12.0, 14.0, 16.0, 18.0], id="only windows wholly inside the training, centred"),
        pytest.param((9.0, 30.0), 4, [12.0, 14.0, 16.0, 18.0, 20.0], id="a later last step keeps the later windows"),
        pytest.param(None, 4, [8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0], id="training unknown: all, centred"),
        pytest.param((15.0, 17.0), 4, [], id="training shorter than a window: none"),
    ],
)
def test_rates_are_drawn_at_the_middle_of_their_window_and_only_inside_the_training(
    training: tuple[float, float] | None, window: float, drawn_at: list[float]
) -> None:
    assert [t for t, _ in report.windowed(RATES, window, training)] == drawn_at


def test_the_time_axes_shade_the_training() -> None:
    trained = data()
    trained.training = (3.0, 9.0)
    ax = report.figures(trained)["throughput"].axes[0]
    legend = ax.get_legend()
    assert legend is not None and "training (first to last step)" in [t.get_text() for t in legend.get_texts()]
    assert len(ax.get_lines()) == 1, "the shading is no line"


def test_every_duration_in_the_reports_queries_is_one_promql_reads_even_off_jittered_scrapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Samples 1.001 s apart (a scrape late by a millisecond, under load) once made "[1200s:1.001s]", which
    Prometheus refuses with 400 ("unknown unit"): a loop run of the e2e report test failed so."""
    queries: list[str] = []

    def prom(url: str, endpoint: str, promql: str, **params: float) -> list[dict[str, object]]:
        queries.append(promql)
        values = [[T0 + 1.001 * i, str(i)] for i in range(20)]
        return [{"metric": {"rank": "0"}, "values": values, "value": [T0 + 20, "1"]}]

    monkeypatch.setattr(report, "_prom", prom)
    report.from_prometheus("http://prom", "ns", "job", report.Span(T0, T0 + 1200, finished=False), window=2.5)
    durations = [d for q in queries for d in re.findall(r"\[([^\]]+)\]", q)]
    assert durations and all(re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+(:(\d+(ms|s|m|h|d|w|y))+)?", d) for d in durations), (
        durations
    )
    assert "1200s:1001ms" in durations and "2500ms" in durations


def test_a_query_prometheus_refuses_is_one_line_naming_the_query_and_prometheus_reason() -> None:
    said = {"status": "error", "errorType": "bad_data", "error": 'parse error: unknown unit "." in duration "1.5s"'}

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # Prometheus' answer to a query it cannot parse
            body = json.dumps(said).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(report.ReportError) as err:
            report._prom(f"http://127.0.0.1:{server.server_port}", "query", "up[1.5s]")
    finally:
        server.shutdown()
        server.server_close()
    assert str(err.value) == (
        f"Prometheus at http://127.0.0.1:{server.server_port} refused the query 'up[1.5s]': {said['error']}"
    )
