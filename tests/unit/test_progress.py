"""Training progress as arithmetic on scrapes: parsing /metrics, windows, p50, the straggler candidate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import generate_latest

from ddp_trainer.metrics import Metrics, StepTiming
from ddpjob_operator.progress import (
    Checkpoint,
    ProgressStatus,
    RankProgress,
    RankSample,
    Scrape,
    Straggler,
    Target,
    human_seconds,
    newest_checkpoint,
    parse_metrics,
    quantile,
    straggler_candidate,
    summarize,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def trainer_text(steps: int, *, first: int = 1, work: float = 0.01, backward: float = 0.02) -> str:
    """The real trainer's /metrics after ``steps`` steps (from step ``first``)."""
    m = Metrics()
    m.pg_ready.set(1)
    for n in range(first, first + steps):
        phases = {"data": work / 2, "forward": work / 2, "backward": backward, "optimizer": 0.0}
        m.record(StepTiming(step=n, samples=16, step_seconds=work + backward, phase_seconds=phases, loss=1.0))
    return generate_latest(m.registry).decode()


def test_the_trainers_own_metrics_parse_into_step_samples_readiness_and_phases() -> None:
    sample = parse_metrics(trainer_text(4, first=41, work=0.01, backward=0.03))
    assert sample.ready and sample.step == 44 and sample.steps == 4 and sample.samples == 64
    assert sample.step_count == 4 and sample.step_sum == pytest.approx(0.16)
    assert sample.work_sum == pytest.approx(0.04), "data + forward + optimizer, not backward"
    assert sample.step_buckets[-1] == (float("inf"), 4)


def test_the_trainers_checkpoint_gauges_become_the_newest_checkpoint_kept_across_attempts() -> None:
    saving = Metrics()
    saving.checkpointed(40, T0.timestamp(), 1.25)
    sample = parse_metrics(generate_latest(saving.registry).decode())
    assert (sample.checkpoint_step, sample.checkpoint_time, sample.save_seconds) == (40, T0.timestamp(), 1.25)
    assert newest_checkpoint([sample], None) == Checkpoint(step=40, time=T0, save_seconds=1.25)
    # The next attempt resumed from step 40 (it saved nothing yet): the save's seconds are kept, the step is not
    # taken back by an older report, and a rank that has no checkpoint yet says nothing.
    resumed = Metrics()
    resumed.checkpointed(40, T0.timestamp())
    later = [parse_metrics(generate_latest(m.registry).decode()) for m in (resumed, Metrics())]
    known = Checkpoint(step=40, time=T0, save_seconds=1.25)
    assert newest_checkpoint(later, known) == known
    assert newest_checkpoint([sample], Checkpoint(step=60)) == Checkpoint(step=60)
    assert Checkpoint.parse(known.to_dict()) == known
    assert known.to_dict() == {"step": 40, "time": "2026-01-01T00:00:00Z", "saveSeconds": 1.25}


def test_a_rank_that_has_not_joined_and_an_empty_page_parse_as_not_ready() -> None:
    assert not parse_metrics(generate_latest(Metrics().registry).decode()).ready
    assert parse_metrics("") == RankSample()


def test_without_the_step_gauge_the_step_is_the_process_step_counter() -> None:
    assert parse_metrics("ddp_steps_total 7.0\n").reached == 7


@pytest.mark.parametrize(
    ("buckets", "p50"),
    [
        ([(0.01, 0), (0.025, 10), (0.05, 10), (float("inf"), 10)], 0.0175),  # all in (0.01, 0.025]: the middle
        ([(0.1, 5), (0.25, 10), (float("inf"), 10)], 0.1),
        ([(0.1, 0), (float("inf"), 4)], 0.1),  # beyond the last bound: the last bound
        ([(0.1, 0), (float("inf"), 0)], None),  # no steps
    ],
)
def test_the_median_interpolates_within_its_bucket_as_prometheus_does(
    buckets: list[tuple[float, float]], p50: float | None
) -> None:
    assert quantile(0.5, buckets) == (pytest.approx(p50) if p50 is not None else None)


def sample(step: int, *, work: float = 0.01, step_seconds: float = 0.03, samples_per_step: int = 16) -> RankSample:
    return RankSample(
        ready=True,
        step=step,
        steps=step,
        samples=step * samples_per_step,
        step_sum=step * step_seconds,
        step_count=step,
        step_buckets=((0.025, 0), (0.05, step), (float("inf"), step)),
        phase_sums={"data": 0.0, "forward": step * work, "backward": step * (step_seconds - work), "optimizer": 0.0},
    )


TARGETS = tuple(Target(rank=r, pod=f"train-{r}", node="node-a", url=f"http://10.0.0.{r}:9090/metrics") for r in (0, 1))


def scrape(seconds: float, ranks: dict[int, RankSample], errors: dict[int, str] | None = None) -> Scrape:
    return Scrape(at=T0 + timedelta(seconds=seconds), attempt=0, targets=TARGETS, ranks=ranks, errors=errors or {})


def test_a_window_of_scrapes_gives_step_throughput_median_and_per_rank_times() -> None:
    s = summarize(
        [
            scrape(0, {0: sample(100), 1: sample(100, work=0.02)}),
            scrape(10, {0: sample(200), 1: sample(200, work=0.02)}),
        ]
    )
    assert s is not None
    assert s.step == 200
    assert s.samples_per_second == 320.0, "2 ranks x 100 steps x 16 samples in 10 s"
    assert s.step_time_p50 == pytest.approx(0.0375)
    assert [(r.rank, r.step_seconds, r.work_seconds) for r in s.ranks] == [(0, 0.03, 0.01), (1, 0.03, 0.02)]
    assert s.slowest_rank == 1
    assert s.window_seconds == 10


def test_scrapes_older_than_the_window_are_left_out() -> None:
    s = summarize([scrape(0, {0: sample(0)}), scrape(100, {0: sample(100)}), scrape(110, {0: sample(200)})], 60)
    assert s is not None and s.samples_per_second == 160.0 and s.window_seconds == 10


def test_a_rank_that_does_not_answer_is_listed_with_the_reason_and_no_times() -> None:
    s = summarize([scrape(0, {0: sample(5)}, {1: "no answer within 2s"})])
    assert s is not None
    assert s.ranks[1] == RankProgress(rank=1, pod="train-1", node="node-a", error="no answer within 2s")
    assert s.step == 5


def test_the_straggler_rule_reads_each_ranks_latest_interval() -> None:
    s = summarize([scrape(0, {0: sample(10), 1: sample(10)}), scrape(5, {0: sample(20), 1: sample(20, work=0.05)})])
    assert s is not None
    # rank 1's cumulative work went from 10 x 0.01 to 20 x 0.05: 0.9 s over 10 steps
    assert s.recent_work == {0: pytest.approx(0.01), 1: pytest.approx(0.09)}


@pytest.mark.parametrize(
    ("work", "factor", "expected"),
    [
        ({0: 0.01, 1: 0.3}, 2.0, 1),
        ({0: 0.01, 1: 0.3, 2: 0.012, 3: 0.011}, 2.0, 1),
        ({0: 0.01, 1: 0.015}, 2.0, None),  # within the factor
        ({0: 0.001, 1: 0.004}, 2.0, None),  # above the factor but by less than the jitter floor
        ({0: 0.3}, 2.0, None),  # nobody to compare with
        ({0: 0.1, 1: 0.25}, 3.0, None),
    ],
)
def test_a_straggler_is_the_rank_above_factor_times_the_median_of_the_others(
    work: dict[int, float], factor: float, expected: int | None
) -> None:
    found = straggler_candidate(work, factor)
    assert (found[0] if found else None) == expected


def test_the_progress_status_reads_back_what_it_wrote() -> None:
    written = ProgressStatus(
        attempt=2,
        joined=2,
        world_size=2,
        step=120,
        samples_per_second=812.5,
        step_time_p50=0.0392,
        window_seconds=60.0,
        slowest_rank=1,
        last_progress_time=T0,
        observed_time=T0 + timedelta(seconds=5),
        ranks=(RankProgress(rank=0, pod="p-0", node="n", step=120, step_seconds=0.04, work_seconds=0.01),),
        straggler=Straggler(rank=1, since=T0),
    )
    raw = written.to_dict()
    assert raw["stepTime"] == "39.2ms"
    assert ProgressStatus.parse(raw) == written


@pytest.mark.parametrize(("seconds", "text"), [(0.0392, "39.2ms"), (0.5, "500ms"), (1.254, "1.25s"), (None, None)])
def test_step_time_reads_well_in_a_column(seconds: float | None, text: str | None) -> None:
    assert human_seconds(seconds) == text


def test_the_operator_reads_the_restart_count_and_reason_the_trainer_exports() -> None:
    m = Metrics()
    m.restart_count.set(2)
    m.restart.info({"reason": 'rank 1\'s training process was killed by SIGKILL ("OOM"?)'})
    sample = parse_metrics(generate_latest(m.registry).decode())
    assert sample.restart_count == 2
    assert sample.restart_reason == 'rank 1\'s training process was killed by SIGKILL ("OOM"?)'
    assert parse_metrics(generate_latest(Metrics().registry).decode()).restart_count == 0
