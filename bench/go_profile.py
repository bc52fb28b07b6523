"""A Go component's CPU profile over a stretch of a benchmark, from its ``/debug/pprof/profile``.

The endpoint profiles for a fixed number of seconds, so a stretch of unknown length is taken as back-to-back
slices of a few seconds; ``go tool pprof`` merges them when it reads them together.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ddpjob_box import toolchain

SLICE_S = 5


class CpuProfile:
    """Slices of ``fetch("/debug/pprof/profile?seconds=N")`` written to ``out_dir`` until ``stop()``."""

    def __init__(self, fetch: Callable[[str], bytes], out_dir: Path, prefix: str) -> None:
        self.fetch, self.out_dir, self.prefix = fetch, out_dir, prefix
        self.paths: list[Path] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pprof-{prefix}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            data = self.fetch(f"/debug/pprof/profile?seconds={SLICE_S}")
            path = self.out_dir / f"{self.prefix}.{len(self.paths):03d}.pprof"
            path.write_bytes(data)
            self.paths.append(path)

    def stop(self) -> list[Path]:
        """After the slice under way ends (at most ``SLICE_S`` seconds): every slice taken."""
        self._stopping.set()
        self._thread.join(timeout=SLICE_S + 30)
        return list(self.paths)


def top(paths: Sequence[Path], nodes: int = 25, *, cumulative: bool = False) -> str:
    """``go tool pprof -top`` over the slices, merged: the functions with the most CPU, own or cumulative."""
    argv = [toolchain.go_command(), "tool", "pprof", "-top", f"-nodecount={nodes}", *(["-cum"] if cumulative else [])]
    out = subprocess.run([*argv, *map(str, paths)], capture_output=True, text=True, check=True)
    return out.stdout
