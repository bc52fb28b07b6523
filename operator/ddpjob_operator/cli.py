"""The operator's commands of `ddpjob` (``ddpjob_cli``): `operator` (alias `run`) starts the Kopf operator, `report`
draws a job's training. ``python -m ddpjob_operator`` runs them alone, as the operator's image does.

Each is one entry of ``COMMANDS``: name -> (help, add_arguments, run). ``main`` builds the parser from such a table.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def _operator_arguments(parser: argparse.ArgumentParser) -> None:
    from ddpjob_operator import node_health
    from ddpjob_operator.policies import node_loss

    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], metavar="NS",
        help="watch this namespace (repeatable; Kopf's patterns work: 'team-*', '!kube-*'); default: all",
    )  # fmt: skip
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="serve Prometheus /metrics here; 0: off")
    parser.add_argument(
        "--liveness", default="http://0.0.0.0:8081/healthz", metavar="URL",
        help="Kopf's liveness endpoint; empty: off",
    )  # fmt: skip
    parser.add_argument(
        "--progress-interval", type=float, default=15.0, metavar="S",
        help="poll each running job's ranks at least this often (faster when its windows are short)",
    )  # fmt: skip
    parser.add_argument("--progress-timeout", type=float, default=2.0, metavar="S", help="per-rank scrape timeout")
    parser.add_argument(
        "--progress-concurrency", type=int, default=32, metavar="N", help="scrapes in flight at once, all jobs together"
    )
    parser.add_argument(
        "--workers", type=int, default=16, metavar="N",
        help="reconciles in flight at once, all jobs together (each mostly waits on the apiserver)",
    )  # fmt: skip
    parser.add_argument(
        "--unhealthy-node-taint", action="append", default=None, metavar="KEY",
        help="a taint that makes a Ready node unhealthy for training: its ranks restart off it (repeat for more; "
        f"default: {', '.join(node_loss.UNHEALTHY_TAINTS)})",
    )  # fmt: skip
    parser.add_argument(
        "--node-exclusion-seconds", type=float, default=node_health.EXCLUSION_SECONDS, metavar="S",
        help="how long a job avoids a node it left because the node was lost or unhealthy (status.excludedNodes)",
    )  # fmt: skip
    parser.add_argument(
        "--no-node-watch", action="store_true",
        help="do not watch nodes (for an install without the right to read them): no restart on a lost node",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="log every reconcile")
    _election_arguments(parser)


def _election_arguments(parser: argparse.ArgumentParser) -> None:
    election = parser.add_argument_group("leader election (several replicas: only the Lease's holder writes)")
    election.add_argument(
        "--leader-elect", action="store_true",
        help="run for leader on a coordination.k8s.io Lease (the chart's default); off: this replica always writes",
    )  # fmt: skip
    election.add_argument("--leader-elect-lease-duration", type=float, default=15.0, metavar="S",
                          help="a standby takes the Lease after it has not been renewed for this long")  # fmt: skip
    election.add_argument("--leader-elect-renew-deadline", type=float, default=10.0, metavar="S",
                          help="a leader that has not renewed for this long stops writing and exits")  # fmt: skip
    election.add_argument("--leader-elect-retry-period", type=float, default=2.0, metavar="S",
                          help="how often the Lease is renewed, or tried")  # fmt: skip
    election.add_argument("--leader-elect-lease", default="ddpjob-operator", metavar="NAME", help="the Lease's name")
    election.add_argument("--leader-elect-namespace", default="", metavar="NS",
                          help="the Lease's namespace; default: the operator pod's (POD_NAMESPACE)")  # fmt: skip
    election.add_argument("--leader-elect-identity", default="", metavar="ID",
                          help="this replica's holderIdentity; default: its pod's name (POD_NAME)")  # fmt: skip


def _election(args: argparse.Namespace) -> Any:
    """The ``leadership.Election`` the flags ask for (None: no election); SystemExit(2) for unsafe durations."""
    from ddpjob_operator import leadership

    if not args.leader_elect:
        return None
    timing = leadership.Timing(args.leader_elect_lease_duration, args.leader_elect_renew_deadline,
                               args.leader_elect_retry_period)  # fmt: skip
    if timing.problem():
        print(f"ddpjob operator: {timing.problem()}", file=sys.stderr)
        raise SystemExit(2)
    return leadership.Election(namespace=args.leader_elect_namespace or leadership.default_namespace(),
                               name=args.leader_elect_lease,
                               identity=args.leader_elect_identity or leadership.default_identity(),
                               timing=timing)  # fmt: skip


def _run_operator(args: argparse.Namespace) -> int:
    import kopf

    import ddpjob_operator.handlers  # noqa: F401  (registers the handlers)
    from ddpjob_operator.policies import node_loss

    election = _election(args)
    kopf.configure(verbose=args.verbose, log_prefix=True)
    logging.getLogger("ddpjob_operator").setLevel(logging.INFO)
    if not args.verbose:  # Kopf logs every handled event at INFO; our transitions are enough
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(
        standalone=True,  # no Kopf peering: several replicas elect a leader on a Lease (``leadership``)
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(
            metrics_port=args.metrics_port,
            progress_interval=args.progress_interval,
            progress_timeout=args.progress_timeout,
            progress_concurrency=args.progress_concurrency,
            workers=args.workers,
            namespaces=list(args.namespace),
            unhealthy_taints=list(args.unhealthy_node_taint or node_loss.UNHEALTHY_TAINTS),
            node_exclusion_seconds=args.node_exclusion_seconds,
            node_watch=not args.no_node_watch,
            election=election,
        ),
    )
    return 0


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    from ddpjob_operator.report import add_arguments

    add_arguments(parser)


def _run_report(args: argparse.Namespace) -> int:
    from ddpjob_operator.report import run

    return run(args)


COMMANDS: dict[str, tuple[str, AddArguments, Run]] = {
    "operator": ("run the operator (Kopf) against the cluster in KUBECONFIG", _operator_arguments, _run_operator),
    "report": (
        "PNG plots and a text summary of a job's training (step time, phases, throughput)",
        _report_arguments,
        _run_report,
    ),
    "run": ("alias of `operator`", _operator_arguments, _run_operator),
}


def main(argv: Sequence[str] | None = None, commands: Mapping[str, tuple[str, AddArguments, Run]] = COMMANDS) -> int:
    """Parse ``argv`` against ``commands`` and run the one it names."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="ddpjob", description="DDPJob: PyTorch DDP training on Kubernetes")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Only the chosen command's arguments are built: `cluster` imports the box, which the operator's
    # image does not ship, so `ddpjob operator` must never import it.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (help_, add_arguments, run) in commands.items():
        command = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            add_arguments(command)
        command.set_defaults(run=run)
    args = parser.parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
