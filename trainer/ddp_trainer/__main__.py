"""``python -m ddp_trainer``: parse options, train, and turn failures into the documented exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from ddp_trainer import errors, signals
from ddp_trainer.config import parse
from ddp_trainer.launch import read_launch
from ddpjob_contract import exits


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        cfg = parse(sys.argv[1:] if argv is None else argv, environ)
        launch = read_launch(environ)
    except errors.PermanentError as err:  # before torch is imported: bad options fail fast
        print(f"ddp_trainer: error: {_one_line(err)}", file=sys.stderr)
        return exits.EXIT_PERMANENT
    from ddp_trainer import distributed, train  # imports torch

    train.setup_logging(launch.rank)

    try:
        train.run(cfg, launch)
    except errors.PermanentError as err:
        print(f"ddp_trainer: error: {_one_line(err)}", file=sys.stderr)
        return exits.EXIT_PERMANENT
    except Exception as err:
        if not distributed.is_retryable(err):
            raise  # a bug: Python prints the traceback and exits 1
        print(f"ddp_trainer: retryable: lost a peer or a collective timed out: {_one_line(err)}", file=sys.stderr)
        return exits.EXIT_RETRYABLE
    return exits.EXIT_OK


if __name__ == "__main__":
    signals.install()  # first: threads started from here on inherit the blocked signals
    sys.exit(main())
