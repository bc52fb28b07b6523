"""One training process: parse options, train, and turn failures into the documented exit codes and exit message.

``python -m ddp_trainer`` runs it (``__main__``), in a supervisor's child when it restarts them in place."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence

from ddp_trainer import errors
from ddp_trainer.config import MESSAGE_PATH_ENV, parse
from ddp_trainer.launch import read_launch
from ddpjob_contract import exits


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def _leave_message(path: str, text: str) -> None:
    """One line where whoever started us looks after we exit (Kubernetes: the termination message).

    Only into a file that exists: the container runtime makes it (the kubelet mounts one per container),
    so a run outside a container never creates /dev/termination-log on its host.
    """
    if not path or not os.path.isfile(path):
        return
    try:
        with open(path, "w") as f:
            f.write(text + "\n")
    except OSError as err:
        print(f"ddp_trainer: warning: cannot write the exit message to {path}: {err.strerror}", file=sys.stderr)


def _fail(path: str, message: str, kind: str, code: int) -> int:
    print(f"ddp_trainer: {kind}: {message}", file=sys.stderr)
    _leave_message(path, message)
    return code


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    path = environ.get(MESSAGE_PATH_ENV, "")  # until the options are parsed, the env's word
    try:
        cfg = parse(sys.argv[1:] if argv is None else argv, environ)
        launch = read_launch(environ)
    except errors.PermanentError as err:  # before torch is imported: bad options fail fast
        return _fail(path, _one_line(err), "error", exits.EXIT_PERMANENT)
    path = cfg.observe.termination_message_path
    from ddp_trainer import distributed, report, train  # imports torch

    train.setup_logging(launch.rank)

    try:
        result = train.run(cfg, launch)
    except errors.PermanentError as err:
        return _fail(path, _one_line(err), "error", exits.EXIT_PERMANENT)
    except errors.Stopped as err:
        return _fail(path, _one_line(err), "stopped", exits.EXIT_SIGTERM)
    except Exception as err:
        if not distributed.is_retryable(err):
            raise  # a bug: Python prints the traceback and exits 1 (the log's tail is the message)
        message = f"lost a peer or a collective timed out: {_one_line(err)}"
        return _fail(path, message, "retryable", exits.EXIT_RETRYABLE)
    summary = report.exit_summary(
        result.steps,
        result.timings,
        compiled=cfg.model.compile,
        restarts=launch.restart_count,
        checkpoint=result.checkpoint,
    )
    _leave_message(path, json.dumps(summary, separators=(",", ":")))
    return exits.EXIT_OK
