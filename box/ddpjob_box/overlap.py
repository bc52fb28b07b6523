"""Run setup steps side by side: each as its own process group, each started once the steps it needs are done.

A step's output is read, not shown: it moves the step's figure (ddpjob_box.step_figures), and its last
lines are printed if it fails. When one step fails, the others are stopped (their whole process group, so
no compiler or buildah is left running) or, where stopping half-way would leave the machine worse (apt-get),
awaited; then StepFailed names the step.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, TextIO

from ddpjob_box.errors import BoxError
from ddpjob_box.step_figures import Figure, NoFigure
from ddpjob_box.step_report import StepTime, due, format_elapsed, progress_line

TAIL_LINES = 30
"""Lines of a failed step's output printed with its failure."""
STOP_GRACE = 10.0
"""Seconds a stopped step gets to exit on SIGTERM before its process group is killed."""
POLL = 0.2
TTY_EVERY = 1.0


@dataclass(frozen=True)
class Step:
    """One command of the setup, and the steps that must be done before it starts."""

    name: str
    argv: Sequence[str]
    after: tuple[str, ...] = ()
    figure: Callable[[], Figure] = NoFigure
    # False where a step killed half-way leaves the machine worse (apt-get, dpkg): it is awaited instead
    stoppable: bool = True
    env: Mapping[str, str] = field(default_factory=dict)


class StepFailed(BoxError):
    """A step exited non-zero; ``times`` holds every step's outcome, the others stopped or awaited."""

    def __init__(self, step: str, code: int, last: str, times: list[StepTime]):
        super().__init__(f"the step '{step}' failed (exit status {code}): {last}")
        self.step = step
        self.times = times


class _Running:
    """A started step: its process, and a thread reading its output into the figure and the tail."""

    def __init__(self, step: Step, started: float):
        self.step = step
        self.started = started
        self.figure = step.figure()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.lock = threading.Lock()
        self.last_line = started
        self.last_figure = ""
        self.proc = subprocess.Popen(
            list(step.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,  # its own process group: stopping it reaches its children
            env={**os.environ, "PYTHONUNBUFFERED": "1", **step.env},
        )
        self.reader = threading.Thread(target=self._read, name=f"step-{step.name}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.lock:
                self.tail.append(line.rstrip("\n"))
                self.figure.read(line)

    def figure_text(self) -> str:
        with self.lock:
            return self.figure.text()

    def finish(self) -> int:
        code = self.proc.wait()
        self.reader.join(timeout=5)
        return code

    def stop(self) -> None:
        """SIGTERM to the step's process group, SIGKILL to what is left of it after STOP_GRACE."""
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _signal_group(self.proc.pid, signal.SIGKILL)  # the leader gone, its children may linger
        self.finish()


def stop_like_ctrl_c() -> None:
    """In a step's own program: SIGTERM (how run_steps stops it) raises KeyboardInterrupt, so its ``finally``
    blocks and temporary directories are cleaned up before it exits."""
    signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Printer:
    """Lines for a log, or one line rewritten in place on a terminal."""

    def __init__(self, out: TextIO, tty: bool):
        self.out = out
        self.tty = tty
        self.status = False

    def line(self, text: str) -> None:
        if self.status:
            self.out.write("\r\033[K")
            self.status = False
        self.out.write(text + "\n")
        self.out.flush()

    def rewrite(self, text: str) -> None:
        width = shutil.get_terminal_size().columns - 1  # a wrapped line could not be rewritten in place
        self.out.write("\r\033[K" + text[:width])
        self.out.flush()
        self.status = True


def run_steps(steps: Sequence[Step], *, out: TextIO = sys.stdout, tty: bool | None = None) -> list[StepTime]:
    """Run ``steps``, each as soon as the steps it names in ``after`` are done, and return their times in
    the order given. Raises StepFailed when one fails, once no other is left running."""
    names = [s.name for s in steps]
    for step in steps:
        unknown = set(step.after) - set(names)
        if unknown:
            raise ValueError(f"step {step.name!r} waits for unknown steps {sorted(unknown)}")
    printer = _Printer(out, out.isatty() if tty is None else tty)
    pending = list(steps)
    running: list[_Running] = []
    times: dict[str, StepTime] = {}
    last_tty = 0.0
    try:
        while pending or running:
            for step in [s for s in pending if all(a in times for a in s.after)]:
                pending.remove(step)
                printer.line(f"{step.name}: started")
                running.append(_Running(step, time.monotonic()))
            if not running:
                raise ValueError(f"steps {[s.name for s in pending]} wait for each other")
            for run in [r for r in running if r.proc.poll() is not None]:
                running.remove(run)
                code = run.finish()
                ended = time.monotonic()
                if code != 0:
                    times[run.step.name] = StepTime(run.step.name, run.started, ended, "failed")
                    raise _failure(run, code, printer, running, pending, times, names)
                times[run.step.name] = StepTime(run.step.name, run.started, ended)
                figure = run.figure_text()
                printer.line(f"{run.step.name}: done in {format_elapsed(ended - run.started)}" + _then(figure))
            now = time.monotonic()
            if printer.tty and running and now - last_tty >= TTY_EVERY:
                last_tty = now
                lines = (progress_line(r.step.name, now - r.started, r.figure_text()) for r in running)
                printer.rewrite("   ".join(lines))
            elif not printer.tty:
                for run in running:
                    figure = run.figure_text()
                    if due(now=now, last_line=run.last_line, figure=figure, last_figure=run.last_figure):
                        run.last_line, run.last_figure = now, figure
                        printer.line(progress_line(run.step.name, now - run.started, figure))
            time.sleep(POLL)
    except BaseException:
        # Ctrl-C, or a bug: leave nothing running behind us
        for run in running:
            if run.step.stoppable:
                run.stop()
            else:
                run.finish()
        raise
    return [times[name] for name in names]


def _then(figure: str) -> str:
    return f" ({figure})" if figure else ""


def _failure(
    failed: _Running,
    code: int,
    printer: _Printer,
    running: list[_Running],
    pending: list[Step],
    times: dict[str, StepTime],
    names: list[str],
) -> StepFailed:
    """Print the failed step's last lines, stop or await the others, and say which step failed."""
    lines = [line for line in failed.tail if line.strip()]
    printer.line(f"{failed.step.name}: failed after {format_elapsed(times[failed.step.name].seconds)}, its last lines:")
    for line in lines:
        printer.line(f"  | {line}")
    for run in list(running):
        if run.step.stoppable:
            printer.line(f"{run.step.name}: stopping it, as {failed.step.name} failed")
            run.stop()
            outcome = "stopped"
        else:
            printer.line(f"{run.step.name}: letting it finish (stopping it half-way could leave the machine worse)")
            outcome = "done" if run.finish() == 0 else "failed"
        running.remove(run)
        times[run.step.name] = StepTime(run.step.name, run.started, time.monotonic(), outcome)
    for step in pending:
        times[step.name] = StepTime(step.name, 0.0, 0.0, "skipped")
    pending.clear()
    last = lines[-1].strip().removeprefix("ddpjob: ") if lines else "no output"
    return StepFailed(failed.step.name, code, last, [times[name] for name in names])
