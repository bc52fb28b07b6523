"""What ``make demo`` prints once the ranks stop stepping: the wait is labelled, not shown as 0.0 img/s (issue 31)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ddpjob_box.demo import MANIFEST, after_stepping, final_figures, trainer_option

LINGER = "metrics served until Prometheus reads them, up to 10s; then a last barrier"


@pytest.mark.parametrize(
    ("reached", "total", "quiet", "linger", "exited", "said"),
    [
        ([0.0, 0.0], 500, 30.0, 10.0, False, None),
        ([250.0, 250.0], 500, 1.0, 10.0, False, None),
        ([250.0, 250.0], 500, 20.0, 10.0, False, None),
        ([500.0, 499.0], 500, 1.0, 10.0, False, None),
        ([500.0, 500.0], 500, 4.0, 10.0, False, f"step 500/500 done 4s ago: waiting for the ranks to exit ({LINGER})"),
        ([500.0, 500.0], 500, 2.0, None, False,
         "step 500/500 done 2s ago: waiting for the ranks to exit (a last barrier)"),
        ([500.0, 500.0], 500, 12.0, 10.0, True,
         "step 500/500 done 12s ago; the ranks have exited: waiting for the operator to mark the job Succeeded"),
        ([120.0, 120.0], None, 2.0, None, False, None),
        ([120.0, 120.0], None, 8.0, None, False, "no new step for 8s: the ranks are finishing, or stalled"),
        ([0.0, 0.0], None, 60.0, None, False, None),
    ],
    ids=[
        "starting: the figures",
        "stepping: the figures",
        "a pause before the last step: the figures",
        "one rank still has a step to go: the figures",
        "every rank at the last step: waiting for them to exit, and why so long",
        "no linger: only the barrier",
        "the pods have exited: waiting for the operator",
        "unknown total, a short pause: the figures",
        "unknown total, a long pause: said as such",
        "unknown total, no step yet: the figures",
    ],
)  # fmt: skip
def test_after_the_last_step_the_demo_says_what_it_waits_for(
    reached: list[float], total: int | None, quiet: float, linger: float | None, exited: bool, said: str | None
) -> None:
    assert after_stepping(reached, total, quiet, linger, exited) == said


def trainer(args: list[str], env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "trainer", "args": args, "env": env or []}
    return {"spec": {"template": {"spec": {"containers": [{"name": "sidecar"}, container]}}}}


@pytest.mark.parametrize(
    ("job", "found"),
    [
        (trainer(["--steps", "500"]), 500.0),
        (trainer(["--steps=300"]), 300.0),
        (trainer([], [{"name": "TRAIN_STEPS", "value": "200"}]), 200.0),
        (trainer(["--steps", "100"], [{"name": "TRAIN_STEPS", "value": "200"}]), 100.0),
        (trainer(["--epochs", "2"]), None),
        (trainer(["--steps", "many"]), None),
        ({"spec": {}}, None),
    ],
    ids=["flag", "flag=value", "env", "the flag over the env", "epochs: unknown", "not a number", "no container"],
)
def test_the_demo_reads_the_trainer_s_steps_as_the_trainer_does(job: dict[str, Any], found: float | None) -> None:
    assert trainer_option(job, "--steps") == found


def test_the_demo_s_job_gives_its_last_step_and_its_linger() -> None:
    job = next(d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d.get("kind") == "DDPJob")
    assert (trainer_option(job, "--steps"), trainer_option(job, "--metrics-linger-seconds")) == (300.0, 10.0)


def test_after_the_job_ends_the_demo_shows_the_runs_final_figures_not_its_exited_ranks_zero_rate() -> None:
    """The last line after Succeeded showed `0.0 img/s` per rank: the ranks had exited, so nothing was read."""
    progress = {
        "final": True,
        "step": 300,
        "samplesPerSecond": 1730.0,
        "stepTime": "18.5ms",
        "ranks": [{"rank": 0, "pod": "cpu-ddp-0", "step": 300}, {"rank": 1, "pod": "cpu-ddp-1", "step": 300}],
    }
    line = final_figures({"phase": "Succeeded", "progress": progress})
    assert line == (
        "rank 0: step   300   rank 1: step   300   1730.0 img/s in all   18.5ms a step (the run's final figures)"
    )
    assert final_figures({"phase": "Succeeded", "progress": {**progress, "final": False}}) is None
    assert final_figures({"phase": "Failed"}) is None
