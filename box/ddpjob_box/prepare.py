"""The setup behind ``make setup``, ``make test`` and ``make demo``: the virtualenv, the Debian packages, the
Go builds and the images, side by side where they can be, with a progress line per step and a table of
step times at the end; then the command itself.

The Go builds (CPU) run while the virtualenv and the images download and write (network, disk). Each piece
stays cached by its inputs (toolchain.py, images.py, the Makefile's venv stamp), so a warm run only checks.

Runs on the system's python3 with ``PYTHONPATH=box`` and the standard library alone: the virtualenv is one
of its steps. ``python -m ddpjob_box.prepare {setup,test,demo,tools} [-- command ...]``
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from ddpjob_box.overlap import Step, StepFailed, run_steps, stop_like_ctrl_c
from ddpjob_box.step_figures import GoFigure, ImageFigure
from ddpjob_box.step_report import encode_times, step_table

STEP_TIMES_ENV = "DDPJOB_SETUP_STEP_TIMES"
"""Where the command run after the setup finds the setup's step times (the demo adds its own to them)."""
PURPOSES = ("setup", "test", "demo", "tools")
DEMO_EXTRAS = "operator"
"""The venv's extras for the demo: it runs the box and the chart (its images hold the operator and the trainer), so
the host needs neither torch nor the test tools; ``make test`` adds them (the Makefile's ``VENV_EXTRAS``)."""
NODES_SIDE_BY_SIDE = {"setup": 9, "test": 9, "demo": 1}
"""The nodes each command runs at once (``make test``: its three box groups' 2, 4 and 3, tests/workers.py), each on a
node store of its own, which the setup fills with the images beside the Go builds (kubenode.store_fill: the first
imports them, the others link to its files)."""


def steps_for(purpose: str, *, python: str, make: str = "make") -> list[Step]:
    """What each command needs, and in which order. ``setup`` builds what ``test`` and ``demo`` need; the
    demo needs no Kueue and no torch on the host; ``test`` also lints, once the virtualenv is there."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}: choose one of {', '.join(PURPOSES)}")
    sub_make = [make, "--no-print-directory"]
    go = Step(
        "Go builds",
        [python, "-m", "ddpjob_box.toolchain", "--progress", "--for", "demo" if purpose == "demo" else "test"],
        figure=GoFigure,
    )
    if purpose == "tools":
        return [go]
    steps = [
        Step("venv", [*sub_make, "venv", *([f"VENV_EXTRAS={DEMO_EXTRAS}"] if purpose == "demo" else [])]),
        # apt-get killed half-way leaves dpkg to be repaired by hand: awaited, never stopped
        Step("Debian packages", [*sub_make, "system-packages"], stoppable=False),
        go,
        Step(
            "images",
            [python, "-m", "ddpjob_box.images", "--export-layout"],
            after=("Debian packages",),
            figure=ImageFigure,
        ),
        Step(
            "node stores",
            [python, "-m", "ddpjob_box.kubenode.store_fill", "--stores", str(NODES_SIDE_BY_SIDE[purpose])],
            after=("images",),
            figure=ImageFigure,
        ),
    ]
    if purpose == "test":
        steps.append(Step("lint", [*sub_make, "lint"], after=("venv",)))
    return steps


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The arguments before ``--``, and the command after it."""
    args = list(argv)
    if "--" not in args:
        return args, []
    at = args.index("--")
    return args[:at], args[at + 1 :]


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    own, command = split_command(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m ddpjob_box.prepare", description=__doc__)
    parser.add_argument("purpose", choices=PURPOSES, help="the make target the setup is for")
    args = parser.parse_args(own)
    # a CI runner's timeout, like Ctrl-C: stop the steps, leave nothing running
    stop_like_ctrl_c()
    title = f"make {args.purpose}: setup step times"
    try:
        times = run_steps(steps_for(args.purpose, python=sys.executable))
    except StepFailed as err:
        print(step_table(err.times, title=title), flush=True)
        print(f"ddpjob: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\nsetup interrupted; every step stopped", file=sys.stderr, flush=True)
        sys.exit(130)
    print(step_table(times, title=title), flush=True)
    if command:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.execvpe(command[0], command, {**os.environ, STEP_TIMES_ENV: encode_times(times)})


if __name__ == "__main__":
    main()
