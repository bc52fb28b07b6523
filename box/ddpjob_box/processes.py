"""Child processes that cannot outlive the box.

Each component runs in its own session, so a Ctrl-C in the terminal reaches only
the box, which then stops its children in order. PR_SET_PDEATHSIG makes the
kernel kill a child if the box itself dies (SIGKILL, a crashed test run), so no
process is ever left behind. The kernel sends it when the *thread* that started
the child ends, so every child is started by one thread that lives as long as
the box's process, whichever thread asks. The box only ever signals processes it
started.

A Supervisor starts a component again when it exits on its own, as kubelet does
for a control plane's static pods: the real kube-scheduler, for one, exits on
purpose when it finds its cache inconsistent, and expects to be restarted.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ddpjob_box.errors import BoxError

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="box-spawner")
"""Starts every child, so that each one's parent thread is this one, which ends only with the process."""

BACKOFF_MAX = 30.0
"""The longest wait before starting again a component that keeps exiting (1, 2, 4 ... seconds before)."""
STEADY_SECONDS = 60.0
"""A component that ran this long before it exited is started again after 1 s, as if for the first time."""


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGKILL when the thread that started it exits."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """A child in its own session that dies with this process, whichever thread asks for it."""

    def popen_here() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent, **popen)

    return _SPAWNER.submit(popen_here).result()


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


KLOG_ERROR = re.compile(r'^[EF]\d{4} [\d:.]+\s+\d+ [^\]]+\] (?:"((?:[^"\\]|\\.)*)"|(.*))')
"""A klog line at level E or F: the quoted message of a structured line, or the plain text of another."""
LAST_ERROR_SAID = re.compile(r'\(its last error: "(.*)"\); the box started it again')
"""How a restart line quotes the component's last error, for those who count the causes."""
ERROR_TAIL_BYTES = 65536


def last_error(path: Path, since: int = 0, *, within: int = 3) -> str:
    """The message of a klog error or fatal line among the last ``within`` lines written to ``path`` after
    byte ``since``: what a component said as it exited on purpose (klog's FlushAndExit), not an error it
    logged and survived long before; "" if none."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(since, size - ERROR_TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    for line in reversed([line for line in text.splitlines() if line.strip()][-within:]):
        if found := KLOG_ERROR.match(line):
            return (found.group(1) if found.group(1) is not None else found.group(2)).strip()
    return ""


def children(pid: int) -> set[int]:
    """The process's children, from /proc (none if it is gone, or goes while it is read)."""
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found |= {int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()}
        except OSError:
            continue
    return found


def exited(pid: int) -> bool:
    """No such process, or a zombie its parent has not reaped yet (``kill(pid, 0)`` still finds those)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


class Component:
    """One long-running child process with its log file."""

    @classmethod
    def box_module(cls, name: str, module: str, args: Sequence[str], log_path: Path) -> Component:
        """``python -m <module> args`` of this package, importable whether or not the project is installed."""
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        return cls(name, [sys.executable, "-m", module, *args], log_path, env=env)

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        """How many times a Supervisor started it again after it exited on its own."""
        self.backoffs: list[float] = []
        """The wait, in seconds, chosen after each exit on its own, in order."""
        self._wanted = False
        self._lock = threading.Lock()
        self._started_at = 0.0
        self._streak = 0
        self._retry_at: float | None = None
        self._ran = 0.0
        self._log_start = 0

    def start(self) -> None:
        with self._lock:
            self._wanted, self._retry_at = True, None
            self._spawn()

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self.proc = spawn(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self._started_at = time.monotonic()

    def revive(self) -> str | None:
        """Start it again if it exited on its own (not by ``stop``), once its backoff has passed; says so."""
        with self._lock:
            proc = self.proc
            if not self._wanted or proc is None or proc.poll() is None:
                return None
            now = time.monotonic()
            if self._retry_at is None:
                self._ran = now - self._started_at
                if self._ran >= STEADY_SECONDS:
                    self._streak = 0
                backoff = min(2.0**self._streak, BACKOFF_MAX)
                self.backoffs.append(backoff)
                self._retry_at = now + backoff
                return None
            if now < self._retry_at:
                return None
            self._streak, self._retry_at = self._streak + 1, None
            self.restarts += 1
            error = last_error(self.log_path, self._log_start) if proc.returncode > 0 else ""  # not if killed
            why = f' (its last error: "{error[:200]}")' if error else ""
            said = (
                f"{self.name} exited with code {proc.returncode} after {self._ran:.0f}s{why}; "
                f"the box started it again (restart {self.restarts}); its log: {self.log_path}"
            )
            with open(self.log_path, "a") as log:
                log.write(f"--- box: {said}\n")
            self._spawn()
            return said

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self, when: str = "during startup") -> None:
        """Raise a one-line error, followed by the log tail, if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise BoxError(
                f"{self.name} exited with code {self.proc.returncode} {when}; "
                f"its log ({self.log_path}) ends with:\n{tail(self.log_path)}"
            )

    def kill(self) -> None:
        """SIGKILL at once, as a power cut would (no SIGTERM first); not started again until ``start``."""
        with self._lock:
            self._wanted = False
            proc = self.proc
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    def stop(self, grace: float = 10.0) -> None:
        with self._lock:
            self._wanted = False
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Supervisor:
    """Starts again, with a backoff, each of ``components`` that exits on its own, until stopped.

    ``said`` gets one line per restart (each is also written to the component's log)."""

    def __init__(self, components: Sequence[Component], said: Callable[[str], None], period: float = 0.5) -> None:
        self.components, self.said, self.period = list(components), said, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="box-supervisor", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            for component in self.components:
                said = component.revive()
                if said:
                    self.said(said)

    def stop(self) -> None:
        """No component is started again after this returns."""
        self._stop.set()
        self._thread.join()


def wait_until(predicate_desc: str, predicate: object, timeout: float, *, watch: Sequence[Component] = ()) -> None:
    """Poll ``predicate`` until true; fail early if a watched component dies."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while True:
        for component in watch:
            component.check_alive()
        if predicate():
            return
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {c.name} ({c.log_path}):\n{tail(c.log_path)}" for c in watch)
            raise BoxError(f"timed out after {timeout:.0f}s waiting for {predicate_desc}\n{logs}")
        time.sleep(0.2)
