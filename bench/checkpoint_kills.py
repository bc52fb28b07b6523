"""SIGKILL the trainer in the middle of its checkpoint writes, again and again: no checkpoint may fail to load.

    python -m bench.checkpoint_kills               # 100 kills
    python -m bench.checkpoint_kills --kills 5

The real program (``python -m ddp_trainer``, one CPU process, ResNet-18 so a write takes a while)
writes a checkpoint after every step into one directory. As soon as the temp file of its 2nd or 3rd
write appears there, the process is SIGKILLed, after a random part of a typical write's duration. The next run
resumes in the same directory, as a restarted gang would: so each run both proves the previous kill
harmless and suffers the next one.

After every kill, every checkpoint under its final name is loaded the way the trainer loads one
(``checkpoint.load_latest``'s checks: ``torch.load(weights_only=True)``, every key, the step in the
name); one that fails is a violation. A kill counts as *mid-write* when the write's temp file was still
there after the kill (the rename had not happened); the others hit the rename, the fsyncs or the
pruning of old checkpoints. Every run after the first must log ``resumed from step N`` with N the newest
checkpoint the previous kill left.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO, RESULTS_DIR, hermetic_environ, log, machine, need_trainer, table, write_results

NAME = "checkpoint_kills"
TEMP = re.compile(r"^\.step-(\d{9})\.pt\.tmp-\d+$")
TRAINER = [
    "--model", "resnet18", "--image-size", "32", "--batch-size", "2", "--synthetic-samples", "64",
    "--num-workers", "0", "--steps", "1000000", "--checkpoint-interval", "1", "--checkpoint-keep", "2",
    "--log-interval", "1000000",
]  # fmt: skip


def unloadable(directory: Path) -> list[str]:
    """Every final-named checkpoint that the trainer would refuse, with why."""
    import torch

    from ddp_trainer import checkpoint

    bad = []
    for step, path in checkpoint.complete(str(directory)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            bad.append(f"{path}: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
            continue
        if not isinstance(state, dict) or any(k not in state for k in checkpoint.REQUIRED) or state["step"] != step:
            bad.append(f"{path}: not a whole checkpoint of step {step}")
    return bad


def newest(directory: Path) -> int:
    from ddp_trainer import checkpoint

    done = checkpoint.complete(str(directory))
    return done[0][0] if done else 0


def temps(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if TEMP.match(p.name)] if directory.is_dir() else []


def one_kill(directory: Path, write_seconds: float, rng: random.Random, timeout: float) -> dict[str, Any]:
    """Start the trainer in ``directory``, kill it inside a checkpoint write, and judge what it left."""
    expected, stale = newest(directory), set(temps(directory))  # the last kill's temp file, for the trainer to remove
    env = {**hermetic_environ(), "PYTHONPATH": f"{REPO / 'contract'}:{REPO / 'trainer'}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ddp_trainer", *TRAINER, "--checkpoint-dir", str(directory)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The 2nd or 3rd write of this run, so every run also leaves a checkpoint of its own to resume from.
        target, writes, deadline = rng.choice((2, 3)), set[str](), time.monotonic() + timeout
        while len(writes) < target:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the trainer made {len(writes)} of {target} writes (exit {proc.poll()})")
            writes.update(set(temps(directory)) - stale)
            time.sleep(0.0005)
        seen = time.monotonic()
        delay = rng.uniform(0, write_seconds)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed_after = time.monotonic() - seen
    resumed = re.search(r"resumed from step (\d+)", output)
    left = temps(directory)
    return {
        "delay": round(delay, 4),
        "killed_after_temp_s": round(killed_after, 4),
        "mid_write": bool(left),
        "resumed_from": int(resumed.group(1)) if resumed else 0,
        "expected_resume": expected,
        "newest_after": newest(directory),
        "unloadable": unloadable(directory),
    }


def write_time(directory: Path) -> float:
    """About how long one write takes here: a ResNet-18 with its SGD momentum, saved as the trainer saves."""
    import torch

    from ddp_trainer import checkpoint, models

    model = models.build("resnet18", 1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}
    started = time.monotonic()
    checkpoint.save(str(directory / "probe"), state, keep=1)
    return time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    need_trainer("python -m bench.checkpoint_kills")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take to start a write")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    started = time.monotonic()
    kills: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ddpjob-ckpt-kills-") as tmp:
        seconds = write_time(Path(tmp))
        log(f"{NAME}: {args.kills} kills; a ResNet-18 checkpoint takes about {seconds * 1000:.0f} ms to write")
        directory = Path(tmp) / "checkpoints"
        for i in range(args.kills):
            kill = one_kill(directory, seconds, rng, args.timeout)
            kills.append(kill)
            log(f"  kill {i + 1}/{args.kills}: {'mid-write' if kill['mid_write'] else 'after the rename'}, "
                f"resumed from {kill['resumed_from']} (expected {kill['expected_resume']}), "
                f"unloadable {len(kill['unloadable'])}")  # fmt: skip
    wrong_resume = [k for k in kills if k["resumed_from"] != k["expected_resume"]]
    bad = [b for k in kills for b in k["unloadable"]]
    figures = {
        "kills": len(kills),
        "mid_write": sum(k["mid_write"] for k in kills),
        "unloadable": len(bad),
        "wrong_resume": len(wrong_resume),
        "newest_step": kills[-1]["newest_after"] if kills else 0,
        "write_ms": round(seconds * 1000, 1),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    rows = [[k, v] for k, v in figures.items()]
    markdown = "\n".join(
        [
            f"### Kills during checkpoint writes (seed {args.seed})",
            "",
            table(["", "value"], rows),
            "",
            f"Machine: {machine()}",
        ]
    )
    write_results(NAME, {"figures": figures, "kills": kills, "unloadable": bad, "machine": machine()}, markdown,
                  args.out)  # fmt: skip
    print(markdown)
    if bad or wrong_resume:
        log(f"VIOLATIONS: {bad or ''} {wrong_resume or ''}")
        raise SystemExit(1)
    return figures


if __name__ == "__main__":
    main()
