"""``python -m ddp_trainer``: one training process (``program.main``), or with ``--max-restarts``, a supervisor that
runs it in children and restarts them in place."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from ddp_trainer import errors, signals
from ddp_trainer.config import parse
from ddp_trainer.launch import read_launch
from ddp_trainer.program import main


def run(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``main``, or with ``--max-restarts``, a supervisor that runs it in children and restarts them in place."""
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    try:
        cfg, launch = parse(argv, environ), read_launch(environ)
        supervised = cfg.dist.max_restarts > 0 and not launch.under_agent
    except errors.PermanentError:
        supervised = False  # main says why
    if supervised:
        from ddp_trainer import supervisor

        return supervisor.supervise(argv, launch, cfg.dist.max_restarts, connect_timeout=cfg.dist.pg_timeout_seconds)
    signals.install()  # first: threads started from here on inherit the blocked signals
    return main(argv, environ)


if __name__ == "__main__":
    sys.exit(run())
