"""The `ddpjob` command: the operator's commands (``ddpjob_operator.cli``) and `cluster`, the box for tests and demos
(``ddpjob_box.cli``). It imports both, so that neither imports the other; the box only when `cluster` is chosen (the
operator's image does not ship it)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ddpjob_operator import cli


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    from ddpjob_box.cli import add_arguments

    add_arguments(parser)


def _run_cluster(args: argparse.Namespace) -> int:
    from ddpjob_box.cli import run

    return run(args)


COMMANDS: dict[str, tuple[str, cli.AddArguments, cli.Run]] = {
    "cluster": ("the cluster in a box for tests and demos (`ddpjob cluster up`)", _cluster_arguments, _run_cluster),
    **cli.COMMANDS,
}


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
