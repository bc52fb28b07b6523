"""PROGRESS and ETA (issue 31): the percent of the run's steps done, and the time left at the recent pace.

First the arithmetic (``eta``), then the whole path: the ranks' /metrics polled by the fake cluster of
``test_lifecycle`` into the status that ``kubectl get ddpj`` shows.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import generate_latest

from ddp_trainer.metrics import Metrics
from ddpjob_contract.status import Phase
from ddpjob_operator import eta
from ddpjob_operator.progress import ProgressStatus, RankSample, parse_metrics

from .test_lifecycle import FakeCluster, running, summary


@pytest.mark.parametrize(
    ("step", "total", "percent"),
    [
        (0, 500, 0.0),
        (125, 500, 25.0),
        (1, 3, 33.3),  # rounded down to a tenth
        (499, 500, 99.8),
        (99_999, 100_000, 99.9),  # never 100 before the last step
        (500, 500, 100.0),
        (520, 500, 100.0),  # a program that overshoots its own total
        (120, None, None),  # the total is unknown: epochs over data of unknown size, or no metrics
        (120, 0, None),  # a trainer that has not said yet
        (None, 500, None),  # no step yet
    ],
)
def test_the_percent_done_is_the_step_of_the_total_rounded_down(
    step: int | None, total: int | None, percent: float | None
) -> None:
    assert eta.percent_done(step, total) == percent


@pytest.mark.parametrize(
    ("step", "total", "pace", "seconds"),
    [
        (100, 500, 10.0, 40),
        (100, 500, 3.0, 134),  # rounded up: 133.3 s left is not 133
        (500, 500, 10.0, 0),
        (100, 500, 0.0, None),  # the step did not advance over the window: stalled, no forecast
        (100, 500, None, None),  # a single answer: no pace yet
        (100, None, 10.0, None),  # no total
        (None, 500, 10.0, None),
    ],
)
def test_the_eta_is_the_steps_left_at_the_recent_pace(
    step: int | None, total: int | None, pace: float | None, seconds: int | None
) -> None:
    assert eta.seconds_left(step, total, pace) == seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (60, "1m"), (245, "4m5s"), (3600, "1h"), (7380, "2h3m"), (273_600, "3d4h"),
     (86_400, "1d"), (None, None)],
)  # fmt: skip
def test_the_eta_reads_as_kubectl_writes_an_age(seconds: int | None, text: str | None) -> None:
    assert eta.human_duration(seconds) == text


def test_the_trainers_target_step_is_read_from_its_metrics_and_zero_is_unknown() -> None:
    m = Metrics()
    assert parse_metrics(generate_latest(m.registry).decode()).target is None, "0 until the trainer knows"
    m.target_step.set(500)
    assert parse_metrics(generate_latest(m.registry).decode()).target == 500
    assert parse_metrics("ddp_step 7.0\n").target is None, "a program without the gauge"


def test_the_status_writes_the_percent_and_eta_and_reads_back_their_inputs() -> None:
    written = ProgressStatus(attempt=0, joined=2, world_size=2, step=200, total_steps=500, steps_per_second=4.0)
    raw = written.to_dict()
    assert (raw["totalSteps"], raw["percentDone"], raw["stepsPerSecond"]) == (500, 40.0, 4.0)
    assert (raw["etaSeconds"], raw["eta"]) == (75, "1m15s")
    assert ProgressStatus.parse(raw) == written
    quiet = written.to_dict(running=False)
    assert "etaSeconds" not in quiet and "eta" not in quiet, "no forecast while not Running"
    assert quiet["percentDone"] == 40.0


def _train(c: FakeCluster, steps: list[int], *, target: float | None = 500.0, every: float = 5.0) -> None:
    """Both ranks answer with each step of ``steps`` in turn, ``every`` seconds apart."""
    for step in steps:
        c.now += timedelta(seconds=every)
        c.metrics = {r: RankSample(ready=True, step=float(step), target=target) for r in (0, 1)}
        c.poll()


def test_a_running_job_shows_its_percent_done_and_an_eta_from_the_recent_pace() -> None:
    c = running(2)  # its ranks answered at step 0 once they joined
    _train(c, [50, 100, 150])  # 150 steps in the 15 s since
    written = c.status.to_dict()["progress"]
    assert (written["step"], written["totalSteps"], written["percentDone"]) == (150, 500, 30.0)
    assert (written["stepsPerSecond"], written["etaSeconds"], written["eta"]) == (10.0, 35, "35s")


def test_a_resumed_job_s_pace_is_its_steps_done_not_the_jump_of_its_step_to_the_checkpoint() -> None:
    c = running(2)  # resumed from the checkpoint of step 300: ddp_step reads 0 until its first step
    for step, done in ((301, 1), (311, 11), (321, 21)):
        c.now += timedelta(seconds=5)
        c.metrics = {r: RankSample(ready=True, step=float(step), steps=float(done), target=500.0) for r in (0, 1)}
        c.poll()
    written = c.status.to_dict()["progress"]
    assert (written["percentDone"], written["stepsPerSecond"]) == (64.2, 1.4), "21 steps in 15 s, not 321"
    assert written["etaSeconds"] == 128, "the 179 steps left at 1.4 steps/s"


def test_a_job_whose_ranks_do_not_know_their_total_shows_neither() -> None:
    c = running(2)
    _train(c, [50, 100, 150], target=None)
    written = c.status.to_dict()["progress"]
    assert written["step"] == 150 and written["stepsPerSecond"] == 10.0
    assert not {"totalSteps", "percentDone", "etaSeconds", "eta"} & set(written)


def test_a_stalled_job_keeps_its_percent_and_loses_its_eta() -> None:
    c = running(2)
    _train(c, [100, 200])
    assert c.status.to_dict()["progress"]["eta"] == "15s"
    _train(c, [200] * 13)  # the window (a minute) holds step 200 only
    written = c.status.to_dict()["progress"]
    assert written["percentDone"] == 40.0 and "eta" not in written


def test_a_restarting_job_shows_no_eta() -> None:
    c = running(2, runPolicy={"backoffLimit": 3})
    _train(c, [100, 200])
    c.set(1, phase="Failed", exit_code=200)
    c.step()
    assert c.status.phase is Phase.RESTARTING
    assert "eta" not in c.status.to_dict()["progress"]


def test_a_succeeded_job_is_100_percent_done_with_no_eta() -> None:
    c = running(2)
    _train(c, [100, 200])
    c.set(0, phase="Succeeded", exit_code=0, message=summary(500, 870.0, 0.0184))
    c.set(1, phase="Succeeded", exit_code=0, message=summary(500, 860.0, 0.0186))
    c.settle()
    written = c.status.to_dict()["progress"]
    assert c.status.phase is Phase.SUCCEEDED and written["final"] is True
    assert (written["step"], written["percentDone"]) == (500, 100.0)
    assert not {"stepsPerSecond", "etaSeconds", "eta"} & set(written), "a finished run has no pace or forecast"
