"""Running setup steps side by side with fake steps: the order, the failure that names its step, and nothing
left running after it."""

from __future__ import annotations

import _thread
import io
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from ddpjob_box.overlap import Step, StepFailed, run_steps


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def gone(pid: int) -> bool:
    """Whether the process exits within a second: a signal is delivered, not acted on, at once."""
    deadline = time.monotonic() + 1
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def wait_for_pid(path: Path) -> int:
    deadline = time.monotonic() + 5
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return int(path.read_text())


def test_independent_steps_run_side_by_side_and_a_step_starts_once_those_it_needs_are_done() -> None:
    out = io.StringIO()
    started = time.monotonic()
    times = run_steps(
        [
            Step("go", sh("sleep 1")),
            Step("packages", sh("sleep 0.3")),
            Step("images", sh("sleep 0.7"), after=("packages",)),
        ],
        out=out,
        tty=False,
    )
    assert time.monotonic() - started < 1.8  # 1 s and 0.3 + 0.7 s, side by side
    go, packages, images = times
    assert [t.name for t in times] == ["go", "packages", "images"]
    assert images.started >= packages.ended
    assert go.started < images.started < go.ended
    assert all(t.outcome == "done" for t in times)
    assert "go: started" in out.getvalue()
    assert "packages: done in 0s" in out.getvalue()


def test_a_failing_step_is_named_with_its_last_lines_and_the_step_beside_it_is_stopped_with_its_children(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "grandchild.pid"
    out = io.StringIO()
    started = time.monotonic()
    with pytest.raises(StepFailed) as failed:
        run_steps(
            [
                # a shell whose child (a compiler, say) would outlive it if only the shell were killed
                Step("Go builds", sh(f"sleep 60 & echo $! > {pidfile}; wait")),
                Step(
                    "images",
                    sh(f"while [ ! -s {pidfile} ]; do sleep 0.05; done; echo pulling; echo 'no space'; exit 3"),
                ),
                Step("lint", sh("true"), after=("images",)),
            ],
            out=out,
            tty=False,
        )
    assert time.monotonic() - started < 5  # stopped, not waited for its 60 s
    assert str(failed.value) == "the step 'images' failed (exit status 3): no space"
    assert failed.value.step == "images"
    assert [(t.name, t.outcome) for t in failed.value.times] == [
        ("Go builds", "stopped"),
        ("images", "failed"),
        ("lint", "skipped"),
    ]
    assert gone(wait_for_pid(pidfile))
    log = out.getvalue()
    assert "  | pulling\n  | no space\n" in log
    assert "Go builds: stopping it, as images failed" in log


def test_a_step_that_must_not_be_stopped_half_way_is_awaited_when_another_fails() -> None:
    with pytest.raises(StepFailed) as failed:
        run_steps(
            [Step("Debian packages", sh("sleep 0.5"), stoppable=False), Step("venv", sh("exit 1"))],
            out=io.StringIO(),
            tty=False,
        )
    packages, venv = failed.value.times
    assert (packages.outcome, venv.outcome) == ("done", "failed")
    assert packages.seconds >= 0.45
    assert str(failed.value) == "the step 'venv' failed (exit status 1): no output"


def test_an_interrupted_run_stops_every_step_it_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "sleep.pid"

    def press_ctrl_c_once_started() -> None:
        wait_for_pid(pidfile)
        _thread.interrupt_main()

    # Ctrl-C as a terminal delivers it: a suite started in the background of a script has SIGINT ignored, and
    # interrupt_main() would then do nothing.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=press_ctrl_c_once_started, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run_steps([Step("Go builds", sh(f"sleep 60 & echo $! > {pidfile}; wait"))], out=io.StringIO(), tty=False)
    finally:
        signal.signal(signal.SIGINT, before)
    assert gone(int(pidfile.read_text()))


def test_steps_waiting_for_an_unknown_step_or_for_each_other_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown steps"):
        run_steps([Step("images", sh("true"), after=("packages",))], out=io.StringIO(), tty=False)
    with pytest.raises(ValueError, match="wait for each other"):
        run_steps(
            [Step("a", sh("true"), after=("b",)), Step("b", sh("true"), after=("a",))], out=io.StringIO(), tty=False
        )


def test_the_step_runs_with_unbuffered_python_so_its_progress_arrives_as_it_is_printed() -> None:
    out = io.StringIO()
    run_steps([Step("py", [sys.executable, "-c", "import os; print(os.environ['PYTHONUNBUFFERED'])"])], out=out)
    assert "py: done in" in out.getvalue()


def test_a_stopped_step_that_stops_like_ctrl_c_runs_its_cleanup_before_it_exits(tmp_path: Path) -> None:
    started, cleaned = tmp_path / "started", tmp_path / "cleaned"
    program = (
        "import pathlib, time\n"
        "from ddpjob_box.overlap import stop_like_ctrl_c\n"
        "stop_like_ctrl_c()\n"
        "try:\n"
        f"    pathlib.Path({str(started)!r}).write_text('1')\n"
        "    time.sleep(60)\n"
        "finally:\n"
        f"    pathlib.Path({str(cleaned)!r}).write_text('1')\n"
    )
    box_dir = str(Path(__file__).resolve().parents[2] / "box")
    with pytest.raises(StepFailed):
        run_steps(
            [
                Step("images", [sys.executable, "-c", program], env={"PYTHONPATH": box_dir}),
                Step("Go builds", sh(f"while [ ! -e {started} ]; do sleep 0.05; done; exit 2")),
            ],
            out=io.StringIO(),
            tty=False,
        )
    assert cleaned.exists()
