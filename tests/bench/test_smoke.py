"""One tiny run of each benchmark script: it runs end to end and writes its JSON and table.

No test here asserts a timing: these machines are shared and noisy, and the figures are not the point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import checkpoint_kills, ddp_cpu, instrumentation, operator_scale, stop_vote, trainer_vs_plain

TINY = ["--model", "tinycnn", "--image-size", "16", "--batch-size", "4", "--warmup", "1", "--measure", "1",
        "--repeats", "1"]  # fmt: skip


def written(out: Path, name: str) -> dict[str, object]:
    assert (out / f"{name}.md").read_text().startswith("### ")
    data: dict[str, object] = json.loads((out / f"{name}.json").read_text())
    return data


def test_trainer_vs_plain_runs_both_programs_and_reports_their_ratio(tmp_path: Path):
    result = trainer_vs_plain.main([*TINY, "--out", str(tmp_path)])
    data = written(tmp_path, "trainer_vs_plain")
    assert set(data["runs"]) == {"trainer", "plain loop"}  # type: ignore[call-overload]
    assert [t[0] for t in result["targets"]] == ["trainer / plain loop (wall clock)", "trainer / plain loop (CPU time)"]


def test_instrumentation_runs_the_three_variants_and_scrapes_the_metrics_server(tmp_path: Path):
    instrumentation.main([*TINY, "--scrape-seconds", "0.2", "--out", str(tmp_path)])
    data = written(tmp_path, "instrumentation")
    assert set(data["runs"]) == {"on", "server off", "off"}  # type: ignore[call-overload]


def test_stop_vote_runs_two_ranks_with_and_without_the_vote(tmp_path: Path):
    result = stop_vote.main([*TINY, "--out", str(tmp_path)])
    data = written(tmp_path, "stop_vote")
    assert set(data["runs"]) == {"vote", "no vote"}  # type: ignore[call-overload]
    assert [t[0] for t in result["targets"]] == ["save-on-stop's vote (wall clock)", "save-on-stop's vote (CPU time)"]


def test_ddp_cpu_runs_both_programs_under_torchrun_with_two_gloo_ranks(tmp_path: Path):
    ddp_cpu.main([*TINY, "--world-sizes", "2", "--out", str(tmp_path)])
    data = written(tmp_path, "ddp_cpu")
    runs = data["runs"]
    assert {r["world_size"] for rs in runs.values() for r in rs} == {2}  # type: ignore[attr-defined]
    assert all(r["fwd_bwd_ms"] for rs in runs.values() for r in rs)  # type: ignore[attr-defined]


def test_checkpoint_kills_kills_the_trainer_inside_its_writes_and_every_checkpoint_left_loads(tmp_path: Path):
    figures = checkpoint_kills.main(["--kills", "2", "--out", str(tmp_path)])
    assert figures["kills"] == 2 and figures["unloadable"] == 0 and figures["wrong_resume"] == 0
    assert figures["newest_step"] >= 2, "each run left a checkpoint of its own before it was killed"
    assert written(tmp_path, "checkpoint_kills")["kills"]


@pytest.mark.cluster
def test_operator_scale_creates_a_few_jobs_in_its_own_box_and_times_their_pods(tmp_path: Path):
    result = operator_scale.main(["--jobs", "5", "--rate", "0", "--out", str(tmp_path)])
    figures = written(tmp_path, "operator_scale")["figures"]
    assert figures["done"] == 5  # type: ignore[index]
    assert figures["operator_peak_rss_mb"] > 0  # type: ignore[index]
    assert "POST" in result["markdown"]
