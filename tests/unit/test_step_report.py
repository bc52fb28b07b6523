"""The wording of setup's progress lines and its table of step times."""

from __future__ import annotations

import pytest

from ddpjob_box.step_report import (
    StepTime,
    alongside,
    decode_times,
    due,
    encode_times,
    format_elapsed,
    progress_line,
    step_table,
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (7.4, "7s"), (59.6, "1m00s"), (65, "1m05s"), (370, "6m10s"), (3599, "59m59s"), (3720, "1h02m")],
)
def test_elapsed_times_read_as_seconds_minutes_or_hours(seconds: float, text: str) -> None:
    assert format_elapsed(seconds) == text


def test_a_progress_line_names_the_step_its_elapsed_time_and_its_figure() -> None:
    assert progress_line("images", 70, "building trainer STEP 5/14") == "images: 1m10s, building trainer STEP 5/14"
    assert progress_line("venv", 12, "") == "venv: 12s"


def test_a_step_gets_a_line_every_10_s_while_its_figure_moves_and_every_30_s_while_it_does_not() -> None:
    assert not due(now=109, last_line=100, figure="2", last_figure="1")
    assert due(now=110, last_line=100, figure="2", last_figure="1")
    assert not due(now=125, last_line=100, figure="1", last_figure="1")
    assert due(now=130, last_line=100, figure="1", last_figure="1")


def test_steps_that_share_more_than_a_second_run_alongside_each_other() -> None:
    go = StepTime("Go builds", 0, 370)
    images = StepTime("images", 10, 265)
    lint = StepTime("lint", 369.5, 400)  # starts as the Go builds end: not alongside
    assert alongside(go, [go, images, lint]) == ["images"]
    assert alongside(lint, [go, images, lint]) == []


def test_the_step_table_gives_each_steps_time_what_ran_alongside_and_the_wall_clock() -> None:
    table = step_table(
        [
            StepTime("venv", 0, 105),
            StepTime("Debian packages", 0, 2),
            StepTime("Go builds", 0, 370),
            StepTime("images", 2, 257),
            StepTime("box start", 371, 420),
        ],
        title="make demo: step times",
    )
    assert table.splitlines() == [
        "make demo: step times (wall clock 7m00s):",
        "  venv              1m45s  alongside Debian packages, Go builds, images",
        "  Debian packages      2s  alongside venv, Go builds",
        "  Go builds         6m10s  alongside venv, Debian packages, images",
        "  images            4m15s  alongside venv, Go builds",
        "  box start           49s",
    ]


def test_the_step_table_says_which_step_failed_which_was_stopped_and_which_never_started() -> None:
    table = step_table(
        [
            StepTime("Go builds", 0, 30, "stopped"),
            StepTime("images", 0, 30, "failed"),
            StepTime("lint", 0, 0, "skipped"),
        ],
        title="make test: setup step times",
    )
    assert table.splitlines()[1:] == [
        "  Go builds     30s  stopped; alongside images",
        "  images        30s  failed; alongside Go builds",
        "  lint            -  not started",
    ]


def test_step_times_survive_the_trip_through_an_environment_variable() -> None:
    times = [StepTime("venv", 1.5, 3.25), StepTime("images", 2.0, 9.0, "stopped")]
    assert decode_times(encode_times(times)) == times
    assert decode_times("") == []
