"""``make demo``: the whole user path in the box, narrated.

Starts the control plane, the node (kubelet with containerd, running the images built from the
Dockerfile) and Prometheus; installs the operator with the chart (helm install, the built operator
image); applies the CPU example from manifests/ with the real kubectl; shows each rank's progress
live; ends with a summary table and the Prometheus URL. Ctrl-C at any point tears everything down.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ddpjob_box import toolchain
from ddpjob_box.box import Box
from ddpjob_box.errors import BoxError
from ddpjob_box.heartbeat import heartbeat
from ddpjob_box.prepare import STEP_TIMES_ENV
from ddpjob_box.step_report import StepTime, decode_times, step_table

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "manifests" / "cpu-ddp.yaml"
CHART = REPO / "helm" / "ddpjob"
NAMESPACE = "demo"


QUIET_SECONDS = 6.0
"""With no known last step, a pause this long after stepping is said, not shown as 0.0 img/s."""


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def scrape(ip: str, port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=1) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {name: _metric(text, name) for name in ("ddp_step", "ddp_steps_total", "ddp_samples_total", "ddp_loss")}


def trainer_option(job: Mapping[str, Any], flag: str) -> float | None:
    """A trainer option as the job's trainer container sets it (``--steps 500``, ``--steps=500``, or its
    ``TRAIN_STEPS`` env value), as the trainer reads it: the flag first, then the env variable; None if unset."""
    containers = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    trainer = next((c for c in containers if c.get("name") == "trainer"), containers[0] if containers else {})
    args = [str(a) for a in trainer.get("args") or []]
    env = {e.get("name"): e.get("value") for e in trainer.get("env") or [] if "value" in e}
    found: object = env.get("TRAIN_" + flag.removeprefix("--").replace("-", "_").upper())
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.removeprefix(flag + "=")
    try:
        return float(str(found)) if found is not None else None
    except ValueError:
        return None


def after_stepping(
    reached: Sequence[float], total: int | None, quiet: float, linger: float | None, exited: bool
) -> str | None:
    """What the demo says in place of the ranks' 0.0 img/s once they stop stepping, or None while they step.

    ``reached``: each rank's step (0 for one not heard from); ``total``: the trainer's --steps (None: bounded by
    epochs, or not known); ``quiet``: seconds since a rank last stepped; ``linger``: --metrics-linger-seconds;
    ``exited``: every pod has exited. After the last step each rank serves its metrics until Prometheus has read
    the final values (at most ``linger`` seconds), then meets the others at a last barrier and exits, and only then
    does the operator mark the job Succeeded.
    """
    if not reached or max(reached) <= 0:
        return None  # starting, or joining: no step yet
    if total and min(reached) >= total:
        done = f"step {total}/{total} done {quiet:.0f}s ago"
        if exited:
            return f"{done}; the ranks have exited: waiting for the operator to mark the job Succeeded"
        lingering = "a last barrier"
        if linger:
            lingering = f"metrics served until Prometheus reads them, up to {linger:g}s; then {lingering}"
        return f"{done}: waiting for the ranks to exit ({lingering})"
    if not total and quiet >= QUIET_SECONDS:
        return f"no new step for {quiet:.0f}s: the ranks are finishing, or stalled"
    return None


def final_figures(status: Mapping[str, Any]) -> str | None:
    """Once the job has ended, its run's own final figures (``status.progress``, from the ranks' exit summaries) in
    place of the ranks' last readings, which show 0.0 img/s once they have exited; None without final figures."""
    progress = status.get("progress") or {}
    if not progress.get("final"):
        return None
    ranks = "   ".join(f"rank {r.get('rank')}: step {r.get('step', 0):5.0f}" for r in progress.get("ranks") or [])
    said = [ranks] if ranks else []
    if progress.get("samplesPerSecond") is not None:
        said.append(f"{progress['samplesPerSecond']:.1f} img/s in all")
    if progress.get("stepTime"):
        said.append(f"{progress['stepTime']} a step")
    return "   ".join(said) + " (the run's final figures)"


class Demo:
    def __init__(self, box: Box, kubectl: Path):
        assert box.plane is not None
        self.box = box
        self.kubectl_bin = kubectl
        self.kubeconfig = box.plane.kubeconfig

    def helm(self, *args: str) -> str:
        helm = toolchain.ensure(toolchain.helm_build())["helm"]
        proc = subprocess.run(
            [str(helm), f"--kubeconfig={self.kubeconfig}", *args], capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            raise BoxError(f"helm {' '.join(args[:2])} failed: {proc.stderr.strip()}")
        return proc.stdout

    def kubectl(self, *args: str) -> str:
        proc = subprocess.run(
            [str(self.kubectl_bin), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise BoxError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def job(self, name: str) -> dict[str, Any]:
        return dict(yaml.safe_load(self.kubectl("get", "ddpjob", name, "-n", NAMESPACE, "-o", "yaml")))

    def pods(self, name: str) -> list[dict[str, Any]]:
        listing = yaml.safe_load(
            self.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"ddpjob.dev/job-name={name}", "-o", "yaml")
        )
        return sorted(listing["items"], key=lambda p: int(p["metadata"]["labels"]["ddpjob.dev/rank"]))

    def watch(self, name: str, metrics_port: int) -> dict[str, Any]:
        last: dict[str, tuple[float, float, float]] = {}  # rank -> (time, samples, steps)
        reached: dict[str, float] = {}  # rank -> the step it reached (ddp_step: survives a resume)
        stepped = time.monotonic()  # when a rank last stepped
        while True:
            job = self.job(name)
            status = job.get("status") or {}
            phase = status.get("phase", "Pending")
            ranks = []
            pods = self.pods(name)
            for pod in pods:
                rank = pod["metadata"]["labels"]["ddpjob.dev/rank"]
                ip = pod.get("status", {}).get("podIP")
                values = scrape(ip, metrics_port) if ip else {}
                now = time.monotonic()
                before = last.get(rank)
                if not values:  # not serving yet, or exited: show the last reading, at rest
                    steps = before[2] if before else 0.0
                    ranks.append(f"rank {rank}: step {steps:5.0f}  {0.0:7.1f} img/s")
                    continue
                steps, samples = values["ddp_steps_total"], values["ddp_samples_total"]
                fresh = before is not None and now > before[0] and samples >= before[1]
                rate = (samples - before[1]) / (now - before[0]) if fresh and before else 0.0
                last[rank] = (now, samples, steps)
                step = max(values["ddp_step"], steps)
                if step > reached.get(rank, 0.0):
                    reached[rank], stepped = step, now
                ranks.append(f"rank {rank}: step {steps:5.0f}  {rate:7.1f} img/s")
            total = trainer_option(job, "--steps")
            exited = bool(pods) and all(p.get("status", {}).get("phase") == "Succeeded" for p in pods)
            rest = after_stepping(
                [reached.get(p["metadata"]["labels"]["ddpjob.dev/rank"], 0.0) for p in pods],
                int(total) if total else None,
                time.monotonic() - stepped,
                trainer_option(job, "--metrics-linger-seconds"),
                exited,
            )
            ended = phase in ("Succeeded", "Failed")
            shown = (final_figures(status) if ended else rest) or "   ".join(ranks)
            restarts = status.get("restarts", 0)
            print(f"{time.strftime('%H:%M:%S')}  {phase:<10} restarts {restarts}  {shown}", flush=True)
            if phase in ("Succeeded", "Failed"):
                return job
            time.sleep(2)

    def summary(self, name: str) -> str:
        prom = self.box.prometheus
        assert prom is not None
        selector = f'namespace="{NAMESPACE}", ddpjob="{name}"'
        queries = {
            "steps": f"max by (rank) (max_over_time(ddp_steps_total{{{selector}}}[1h]))",
            "samples": f"max by (rank) (max_over_time(ddp_samples_total{{{selector}}}[1h]))",
            "step_sum": f"max by (rank) (max_over_time(ddp_step_seconds_sum{{{selector}}}[1h]))",
            "step_count": f"max by (rank) (max_over_time(ddp_step_seconds_count{{{selector}}}[1h]))",
        }
        values: dict[str, dict[str, float]] = {}
        for key, query in queries.items():
            for series in prom.query(query):
                values.setdefault(series["metric"].get("rank", "?"), {})[key] = float(series["value"][1])
        lines = ["| rank | steps | samples | mean step (ms) | img/s |", "|---|---|---|---|---|"]
        for rank in sorted(values, key=lambda r: int(r) if r.isdigit() else -1):
            v = values[rank]
            mean = v.get("step_sum", 0.0) / v["step_count"] if v.get("step_count") else 0.0
            per_step = v.get("samples", 0.0) / v["steps"] if v.get("steps") else 0.0
            rate = per_step / mean if mean else 0.0
            lines.append(
                f"| {rank} | {v.get('steps', 0):.0f} | {v.get('samples', 0):.0f} | {mean * 1000:.1f} | {rate:.1f} |"
            )
        return "\n".join(lines)


@contextlib.contextmanager
def timed(name: str, steps: list[StepTime]) -> Iterator[None]:
    """Add the body's wall-clock interval to ``steps`` as the step ``name``."""
    started = time.monotonic()
    yield
    steps.append(StepTime(name, started, time.monotonic()))


def box_figure(box: Box) -> Callable[[], str]:
    """What the box is starting: the control plane, then the node (its images imported into its containerd),
    then Prometheus."""

    def figure() -> str:
        if box.plane is None:
            return ""
        if box.node is None:
            return "the control plane, then the node (its images imported into its containerd)"
        return "node up; starting Prometheus"

    return figure


def run(keep: bool) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    kubectl = toolchain.ensure(toolchain.kubernetes_build())["kubectl"]
    manifest_job = next(d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d.get("kind") == "DDPJob")
    name = manifest_job["metadata"]["name"]
    metrics_port = int(manifest_job["spec"].get("metricsPort", 9090))
    # the setup's steps (venv, Go builds, images), when make ran it first (ddpjob_box.prepare)
    steps = decode_times(os.environ.get(STEP_TIMES_ENV, ""))
    with tempfile.TemporaryDirectory(prefix="ddpjob-demo-") as tmp:
        box = Box(data_dir=Path(tmp) / "box")
        try:
            print(
                "starting the box: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a kubelet node "
                "with the images built from the Dockerfile (imported into its containerd), Prometheus",
                flush=True,
            )
            with timed("box start", steps), heartbeat("box start", box_figure(box)):
                box.start()
            assert box.plane is not None and box.prometheus is not None
            demo = Demo(box, kubectl)
            print(f"export KUBECONFIG={box.plane.kubeconfig}", flush=True)
            print(f"$ helm install ddpjob helm/ddpjob -n {NAMESPACE} --create-namespace --wait", flush=True)
            with timed("helm install", steps), heartbeat("helm install"):
                demo.helm(
                    "install", "ddpjob", str(CHART), "-n", NAMESPACE, "--create-namespace", "--wait", "--timeout=5m"
                )
            print(f"operator running (kubectl logs -n {NAMESPACE} deploy/ddpjob)", flush=True)
            print(f"$ kubectl apply -n {NAMESPACE} -f manifests/{MANIFEST.name}", flush=True)
            with timed("the job", steps):
                print(demo.kubectl("apply", "-n", NAMESPACE, "-f", str(MANIFEST)).strip(), flush=True)
                job = demo.watch(name, metrics_port)
            print(demo.kubectl("get", "ddpjob", name, "-n", NAMESPACE).strip())
            time.sleep(4)  # one more scrape interval, so the table has the final counts
            print(f"\nsummary of {NAMESPACE}/{name} ({job['status'].get('phase')}), from Prometheus:")
            print(demo.summary(name))
            print(
                f"\nPrometheus: {box.prometheus.url}/graph?g0.expr=ddp_steps_total  (try: "
                "rate(ddp_samples_total[30s]), histogram_quantile(0.5, rate(ddp_step_seconds_bucket[1m])))"
            )
            print("\n" + step_table(steps, title="make demo: step times"), flush=True)
            if keep:
                print("the box keeps running; press Ctrl-C to stop it and remove everything", flush=True)
                while True:
                    time.sleep(3600)
            return 0 if job["status"].get("phase") == "Succeeded" else 1
        except KeyboardInterrupt:
            print("\nstopping the box", flush=True)
            return 130
        except BoxError as err:
            print(f"ddpjob demo: {err}", file=sys.stderr)
            return 2
        finally:
            box.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=sys.stdin.isatty(),
        help="keep the box running after the job ends, until Ctrl-C (default: on a terminal)",
    )
    return run(parser.parse_args(argv).keep)


if __name__ == "__main__":
    sys.exit(main())
