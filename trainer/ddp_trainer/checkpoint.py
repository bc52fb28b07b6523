"""Atomic checkpoints: written by rank 0 to a temp file, fsynced, then renamed into place.

Only files with the final name count, so a torn write is never seen; a final-named file that
still fails to load (a damaged disk) is skipped for the one before it. Every rank loads the
same file onto its own device.
"""

from __future__ import annotations

import logging
import os
import random
import re
from typing import Any

import torch

from ddp_trainer import signals

log = logging.getLogger(__name__)

FORMAT = 1
_NAME = re.compile(r"^step-(\d{9})\.pt$")
_TEMP = re.compile(r"^\.step-\d{9}\.pt\.tmp-\d+$")
REQUIRED = ("format", "step", "epoch", "batch_in_epoch", "model", "optimizer", "scheduler", "scaler", "rng")


def path_for(directory: str, step: int) -> str:
    return os.path.join(directory, f"step-{step:09d}.pt")


def complete(directory: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint renamed into place, newest first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, n)) for n in os.listdir(directory) if (m := _NAME.match(n))]
    return sorted(found, reverse=True)


def save(directory: str, state: dict[str, Any], keep: int) -> str:
    """Write ``state`` as the checkpoint of ``state['step']``; keep the newest ``keep``."""
    os.makedirs(directory, exist_ok=True)
    final = path_for(directory, state["step"])
    temp = os.path.join(directory, f".{os.path.basename(final)}.tmp-{os.getpid()}")
    with signals.partial_file(temp):
        with open(temp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
    _fsync_dir(directory)  # make the rename itself durable
    for _, old in complete(directory)[keep:]:
        os.unlink(old)
    return final


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temps(directory: str) -> None:
    """Temp files left by a process that was SIGKILLed mid-write; never loaded, just clutter."""
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            if _TEMP.match(name):
                os.unlink(os.path.join(directory, name))


def load_latest(directory: str, device: torch.device) -> dict[str, Any] | None:
    """The newest checkpoint that loads and is whole, mapped onto ``device``; None if there is none."""
    for step, path in complete(directory):
        try:
            state = torch.load(path, map_location=device, weights_only=True)
        except Exception as err:  # any unreadable file: fall back to the previous checkpoint
            log.warning("skipping checkpoint %s: %s", path, str(err).splitlines()[0] if str(err) else err)
            continue
        if not isinstance(state, dict) or any(k not in state for k in REQUIRED) or state["step"] != step:
            log.warning("skipping checkpoint %s: not a ddp_trainer checkpoint of step %d", path, step)
            continue
        return state
    return None


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states (numpy is not used, so not saved)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"].cpu())  # map_location moved it to the device; RNG wants CPU
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
