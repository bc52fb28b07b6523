"""``ddpjob cluster ...``: run the box in the foreground."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import signal
import sys
import tempfile
from pathlib import Path

from ddpjob_box.box import Box
from ddpjob_box.controlplane import wait_forever
from ddpjob_box.errors import BoxError
from ddpjob_box.topology import LABEL_PREFIX as TOPOLOGY_PREFIX
from ddpjob_box.topology import parse as parse_topology


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cluster_command", required=True)
    up = sub.add_parser("up", help="start a real control plane in the foreground; Ctrl-C stops it")
    up.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where etcd data, keys and logs go (default: a new temporary directory)",
    )
    up.add_argument("--port", type=int, default=None, help="kube-apiserver port on 127.0.0.1 (default: a free one)")
    up.add_argument("--reset", action="store_true", help="wipe a data directory left by a killed run")
    up.add_argument(
        "--node",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also start the node (kubelet with containerd, runc, a CNI bridge, CoreDNS and kube-proxy, running "
        "the images built from the Dockerfile; needs root) and Prometheus",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="how many nodes (default 1): each its own kubelet, containerd, cgroup root, bridge and /24, named "
        "box-node, box-node-1...; one kube-proxy and one CoreDNS serve them all (docs/box.md)",
    )
    up.add_argument(
        "--simulated-nodes",
        type=int,
        default=0,
        metavar="N",
        help="also N simulated 8-GPU hosts (KWOK, built from the Go module proxy: tools/kwok), tainted "
        "kwok.x-k8s.io/node=fake:NoSchedule, whose pods run until their pod-complete.stage.kwok.x-k8s.io/delay "
        "and Succeed (docs/box.md)",
    )
    up.add_argument(
        "--topology",
        default="",
        metavar="LEVEL=COUNT,...",
        help="label the nodes with racks and blocks, outermost first: 'block=2,rack=2' with --nodes 4 puts them in 2 "
        "blocks of 2 racks (labels topology.ddpjob.dev/block and /rack); with --kueue, also a Kueue Topology and a "
        "ResourceFlavor that names it, for topology-aware scheduling (docs/box.md)",
    )
    up.add_argument(
        "--node-monitor-grace-period",
        default="",
        metavar="DURATION",
        help="the controller-manager's --node-monitor-grace-period (Kubernetes' default 50s): how long until a node "
        "that stopped reporting is NotReady, which is when the operator restarts its ranks elsewhere",
    )
    up.add_argument(
        "--kueue",
        action="store_true",
        help="also install Kueue from its own chart into kueue-system, its manager on the node, built from the Go "
        "module proxy (tools/kueue), with DDPJob as an external framework and a short waitForPodsReady (docs/box.md)",
    )


def run(args: argparse.Namespace) -> int:
    # SIGTERM takes the same orderly path as Ctrl-C; SIGUSR1 prints every thread's stack (a stuck stop).
    # SIGINT is set explicitly: a shell starts background jobs with it ignored, and Python keeps that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # A temporary data dir only when none is given: a box killed outright leaves it (the next box sweeps it).
    temp: contextlib.AbstractContextManager[str] = (
        contextlib.nullcontext("") if args.data_dir else tempfile.TemporaryDirectory(prefix="ddpjob-box-")
    )
    with temp as tmp:
        data_dir = args.data_dir or Path(tmp) / "box"
        if args.simulated_nodes < 0:
            print("ddpjob: --simulated-nodes must be 0 or more", file=sys.stderr)
            return 2
        if args.nodes < 1 or (args.nodes > 1 and not args.node):
            print("ddpjob: --nodes must be 1 or more, and needs --node: drop --no-node or --nodes", file=sys.stderr)
            return 2
        try:
            topology = parse_topology(args.topology)
        except BoxError as err:
            print(f"ddpjob: {err}", file=sys.stderr)
            return 2
        grace = (
            [f"--node-monitor-grace-period={args.node_monitor_grace_period}"] if args.node_monitor_grace_period else []
        )
        box = Box(
            data_dir=data_dir,
            apiserver_port=args.port,
            reset=args.reset,
            with_node=args.node,
            with_prometheus=args.node,
            with_kueue=args.kueue,
            node_count=args.nodes,
            simulated_nodes=args.simulated_nodes,
            topology=topology,
            controller_manager_args=grace,
        )
        try:
            box.start()
            plane = box.plane
            assert plane is not None
            print(f"control plane ready at {plane.server}; logs in {plane.logs_dir}", flush=True)
            for node in box.nodes:
                place = "".join(f", {k.removeprefix(TOPOLOGY_PREFIX)} {v}" for k, v in node.labels.items())
                print(f"node {node.name} Ready ({node.subnet}{place}); it runs {', '.join(node.images)}", flush=True)
            if box.simulated is not None:
                print(f"{box.simulated.count} simulated nodes Ready (KWOK; log {box.simulated.log_path})", flush=True)
            if box.kueue is not None:
                print(f"Kueue ready in namespace kueue-system, its manager from {box.kueue.image}", flush=True)
            if box.prometheus is not None:
                print(f"Prometheus at {box.prometheus.url}", flush=True)
            print(f"export KUBECONFIG={plane.kubeconfig}", flush=True)
            wait_forever()
        except BoxError as err:
            print(f"ddpjob: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("stopping the control plane", flush=True)
        finally:
            box.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddpjob cluster")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
