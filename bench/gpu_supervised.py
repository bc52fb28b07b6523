"""The GPU path as it ships: ``manifests/resnet50-ddp.yaml``'s trainer command under its supervisor, as the operator
starts each rank (``inPlaceRestart: Auto``: MAX_RESTARTS set), on one GPU with NCCL at world size 1.

    python -m bench.gpu_supervised                  # needs a GPU: about 3 minutes on an H200
    # on a device without the venv: PYTHONPATH=$PWD/trainer:$PWD/contract:$PWD/box:$PWD python3 -m bench.gpu_supervised
    python -m bench.gpu_supervised --device cpu     # the CPU smoke run (tinycnn, gloo; tests/bench)

Two parts:

- **A killed child.** The manifest's arguments (fewer steps, a checkpoint every ``--checkpoint-interval``), with
  ``--crash-at-step``: the training child SIGKILLs itself right after that step's checkpoint. Its supervisor must
  start a new child, from the fork server that imported torch without touching CUDA, which initialises CUDA and NCCL,
  loads the newest checkpoint onto the GPU and trains on to the last step. Measured from the kill (the child's last
  line, read as it comes) to the new child's first step line; the run must exit 0 at its last step with one restart
  in its summary.
- **Supervised / unsupervised throughput.** The same arguments, eager unless ``--compile-throughput``, run
  alternately with MAX_RESTARTS=3 (a supervisor and a child forked from its fork server) and without (the trainer
  is the container's process): each run's img/s is the trainer's own exit summary (its warm-up left out). Target:
  supervised / unsupervised >= 0.99, the ratio of the runs taken side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, RESULTS_DIR, hermetic_environ, log, machine, need_trainer, table, write_results
from ddpjob_box.ports import free_port

NAME = "gpu_supervised"
MANIFEST = REPO / "manifests" / "resnet50-ddp.yaml"
RATIO_TARGET = 0.99
CPU_ARGS = ("--model=tinycnn", "--image-size=16", "--batch-size=8", "--num-workers=0", "--amp=none")
"""What the CPU smoke run puts in place of the manifest's model, sizes and precision."""
NO_GPU = "gpu_supervised: no GPU here (torch.cuda.is_available() is False): nothing measured; run it on a CUDA machine"


def manifest_trainer() -> tuple[list[str], dict[str, str]]:
    """The trainer container's arguments and plain environment in the manifest."""
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if doc and doc.get("kind") == "DDPJob":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}
            return [str(a) for a in container["args"]], env
    raise SystemExit(f"{MANIFEST}: no DDPJob")


def with_args(args: Sequence[str], **overrides: str | None) -> list[str]:
    """``args`` with each ``--name=value`` of ``overrides`` set (None: removed), in order, new ones last."""
    out, seen = [], set()
    for arg in args:
        name = arg.split("=", 1)[0].removeprefix("--").replace("-", "_")
        if name in overrides:
            seen.add(name)
            out += _flag(name, overrides[name])
            continue
        out.append(arg)
    for name, value in overrides.items():
        if name not in seen:
            out += _flag(name, value)
    return out


def _flag(name: str, value: str | None) -> list[str]:
    """``--name=value``, ``--name`` for "", nothing for None."""
    if value is None:
        return []
    flag = f"--{name.replace('_', '-')}"
    return [f"{flag}={value}" if value != "" else flag]


def exit_message(scratch: Path) -> str:
    """What the trainer left at its TERMINATION_MESSAGE_PATH (``rank_env``)."""
    path = scratch / "message"
    return path.read_text() if path.exists() else ""


def rank_env(scratch: Path, base: dict[str, str], *, max_restarts: int) -> dict[str, str]:
    """Rank 0 of 1 as the operator starts it (the injected environment that matters to the trainer)."""
    env = {**hermetic_environ(), **base}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "trainer"), str(REPO / "contract"), str(REPO)])
    env |= {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "1", "RANK": "0",
        "LOCAL_RANK": "0", "CHECKPOINT_DIR": str(scratch / "ckpt"), "PYTHONUNBUFFERED": "1",
        "TERMINATION_MESSAGE_PATH": str(scratch / "message"), "TMPDIR": str(scratch),
    }  # fmt: skip
    for cache in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # the manifest's /tmp emptyDir, here a shared one
        if cache in env:
            env[cache] = str(Path(tempfile.gettempdir()) / "ddpjob-gpu-supervised" / cache.lower())
    if max_restarts:
        env["MAX_RESTARTS"] = str(max_restarts)
    (scratch / "message").touch()  # the trainer writes its exit message only where the kubelet made the file
    return env


class Lines:
    """A process's merged output, each line with the monotonic time it arrived."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(list(argv), env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def first(self, text: str, after: float = 0.0) -> tuple[float, str] | None:
        return next(((t, line) for t, line in self.lines if t >= after and text in line), None)


def trainer_command() -> list[str]:
    return [sys.executable, "-m", "ddp_trainer"]


def killed_child(args: list[str], base: dict[str, str], *, steps: int, interval: int, crash: int) -> dict[str, Any]:
    run_args = with_args(args, steps=str(steps), checkpoint_interval=str(interval), log_interval="1",
                         crash_at_step=str(crash), crash_rank="0")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ddpjob-gpu-supervised-") as tmp:
        scratch = Path(tmp)
        env = rank_env(scratch, base, max_restarts=3)
        run = Lines(trainer_command() + run_args, env)
        code = run.wait(timeout=900)
        message = exit_message(scratch)
        saved = sorted(p.name for p in (scratch / "ckpt").glob("step-*.pt"))
    output = "\n".join(line for _, line in run.lines)
    killed = run.first(f"--crash-at-step {crash}: killing rank 0")
    resumed = run.first(f"resumed from step {crash}", after=killed[0]) if killed else None
    next_step = run.first(f"step={crash + 1}/", after=killed[0]) if killed else None
    summary: dict[str, Any] = json.loads(message) if message.startswith("{") else {}
    result = {
        "args": run_args,
        "exit_code": code,
        "summary": summary,
        "killed_at_step": crash,
        "resumed": resumed[1] if resumed else None,
        "kill_to_resumed_s": round(resumed[0] - killed[0], 2) if killed and resumed else None,
        "kill_to_next_step_s": round(next_step[0] - killed[0], 2) if killed and next_step else None,
        "restarting_line": (run.first("restarting the gang in place") or (0, ""))[1],
        "checkpoints_left": saved,
        "output_tail": output.splitlines()[-40:],
    }
    result["ok"] = bool(
        code == 0 and summary.get("step") == steps and summary.get("restarts") == 1 and resumed and next_step
    )
    return result


def throughput(args: list[str], base: dict[str, str], *, steps: int, repeats: int) -> dict[str, Any]:
    run_args = with_args(args, steps=str(steps), log_interval=str(max(steps // 4, 1)))
    rates: dict[str, list[float]] = {"supervised": [], "unsupervised": []}
    for repeat in range(repeats):
        for kind in ("supervised", "unsupervised")[:: 1 if repeat % 2 == 0 else -1]:  # each goes first in turn
            with tempfile.TemporaryDirectory(prefix="ddpjob-gpu-supervised-") as tmp:
                scratch = Path(tmp)
                env = rank_env(scratch, base, max_restarts=3 if kind == "supervised" else 0)
                env.pop("CHECKPOINT_DIR")
                done = subprocess.run(trainer_command() + run_args, env=env, cwd=REPO, capture_output=True, text=True,
                                      timeout=900, check=False)  # fmt: skip
                message = exit_message(scratch)
            if done.returncode != 0 or not message.startswith("{"):
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
                raise SystemExit(f"{kind} run exited {done.returncode}:\n{tail}")
            rate = float(json.loads(message)["samples_per_second"])
            log(f"{kind}: {rate:.1f} img/s")
            rates[kind].append(rate)
    pairs = [s / u for s, u in zip(rates["supervised"], rates["unsupervised"], strict=True)]
    return {"args": run_args, "img_per_s": rates, "ratios": pairs, "ratio_median": statistics.median(pairs)}


def main(argv: Sequence[str] | None = None) -> int:
    need_trainer("python -m bench.gpu_supervised")
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_supervised", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=300, help="steps of the killed-child run")
    parser.add_argument("--crash-at-step", type=int, default=100, help="the child kills itself after this step")
    parser.add_argument("--throughput-steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2, help="supervised/unsupervised pairs")
    parser.add_argument("--compile-throughput", action="store_true", help="keep --compile in the throughput runs")
    parser.add_argument("--part", choices=("both", "restart", "throughput"), default="both")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the results go")
    opts = parser.parse_args(argv)
    import torch

    args, base = manifest_trainer()
    if opts.device == "cpu":
        base["CUDA_VISIBLE_DEVICES"] = ""
        args = with_args(args, **{a.split("=")[0][2:].replace("-", "_"): a.split("=")[1] for a in CPU_ARGS},
                         channels_last=None, compile=None)  # fmt: skip
    elif not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0) if opts.device == "cuda" else "cpu"
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if opts.device == "cuda" else None}  # type: ignore[no-untyped-call]  # fmt: skip
    log(f"{NAME}: {device}, {versions}")
    results: dict[str, Any] = {"machine": machine(), "device": device, "versions": versions}
    rows = []
    if opts.part in ("both", "restart"):
        interval = max(opts.crash_at_step // 2, 1)
        killed = killed_child(args, base, steps=opts.steps, interval=interval, crash=opts.crash_at_step)
        results["killed_child"] = killed
        log(json.dumps({k: v for k, v in killed.items() if k != "output_tail"}))
        summary = killed["summary"]
        ended = f"exit {killed['exit_code']}, step {summary.get('step')}, restarts {summary.get('restarts')}"
        rows.append([f"child killed at step {opts.crash_at_step}: kill -> resumed", f"{killed['kill_to_resumed_s']} s"])
        rows.append(["kill -> next step", f"{killed['kill_to_next_step_s']} s"])
        rows.append(["ended", f"{ended}: {'ok' if killed['ok'] else 'NOT ok'}"])
    if opts.part in ("both", "throughput"):
        eager = args if opts.compile_throughput else with_args(args, compile=None)
        rates = throughput(eager, base, steps=opts.throughput_steps, repeats=opts.repeats)
        results["throughput"] = rates
        rows.append(["supervised img/s", ", ".join(f"{r:.1f}" for r in rates["img_per_s"]["supervised"])])
        rows.append(["unsupervised img/s", ", ".join(f"{r:.1f}" for r in rates["img_per_s"]["unsupervised"])])
        verdict = "met" if rates["ratio_median"] >= RATIO_TARGET else "NOT met"
        rows.append(["supervised / unsupervised, median of pairs",
                     f"{rates['ratio_median']:.3f} (target >= {RATIO_TARGET}: {verdict})"])  # fmt: skip
    markdown = table(["what", "measured"], rows)
    print(markdown)
    write_results(NAME, results, markdown, opts.out)
    ok = results.get("killed_child", {}).get("ok", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
