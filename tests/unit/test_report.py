"""`ddpjob report`: the figures hold the expected series, the PNGs are real images, the summary reads well."""

from __future__ import annotations

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
