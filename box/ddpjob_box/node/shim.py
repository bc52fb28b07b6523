"""The per-container supervisor, like a container runtime's shim.

It outlives restarts of the node agent, so a running pod is neither lost nor
duplicated: the agent re-adopts it from the files written here. It runs the
container's process in a new session, records its pid, and writes the exit code
atomically when it ends. If the box that owns it dies, it kills the process
group, so nothing is ever left running.

Files in ``--dir``: ``env.json`` (input), ``pid`` and ``exit`` (outputs), ``log``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def process_start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def same_process_alive(pid: int, start: str) -> bool:
    return pid > 0 and process_start_time(pid) == start


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _watch_owner(child: subprocess.Popen[bytes], owner_pid: int, owner_start: str) -> None:
    while child.poll() is None:
        if not same_process_alive(owner_pid, owner_start):
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddpjob_box.node.shim")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--owner-pid", type=int, required=True)
    parser.add_argument("--owner-start", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    env = json.loads((args.dir / "env.json").read_text())
    # The agent signals the container's process group; the shim itself only waits.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(args.dir / "log", "ab") as log:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    write_atomic(args.dir / "pid", f"{child.pid} {process_start_time(child.pid)} {time.time():.3f}\n")
    threading.Thread(target=_watch_owner, args=(child, args.owner_pid, args.owner_start), daemon=True).start()
    code = child.wait()
    write_atomic(args.dir / "exit", f"{128 - code if code < 0 else code} {time.time():.3f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
