"""``--max-restarts N``: restart the gang's training processes in place, without new containers or pods.

Each rank's ``python -m ddp_trainer`` stays up as a supervisor, and training runs in a child forked from a fork
server that imported torch and the trainer once. A fresh process spends about 3 s of CPU in those imports before
its first step (``import torch``, and ``torch._dynamo``, which DDP's constructor imports), and that is most of
what a restart costs once Kubernetes is out of the way.

When a child fails in a way a restart can fix (``retryable``: killed by a signal, or the trainer's code for a lost
peer or a collective timeout), its supervisor announces a restart to the gang (``gang``: rank 0's supervisor, on
MASTER_PORT + 1). Every supervisor then ends its child's process group (SIGKILL: a child blocked in a collective
with the lost rank cannot answer anything else) and starts a new child, which joins a new process group on
MASTER_PORT and resumes from the newest checkpoint. Each child reads the number of restarts before it from
TORCHELASTIC_RESTART_COUNT, as under torchrun's agent, and exports it. A child that lost a peer waits a moment for
the rank that failed to speak first, so that the reason is that rank's.

Some failures are not restarted in place: an OOM kill (the container ends, and the kubelet says OOMKilled with the
limit), a child out of restarts (``--max-restarts N``), any other exit (success, a bug, a permanent error, a stop).
The supervisor then tells the gang to stop restarting in place, and exits as its child did, for whoever started it
to take over as if there were no supervisor; its peers do the same as their children fail. So does every supervisor
when one of them is gone (its connection to rank 0's ends). Asked to stop (SIGTERM, SIGINT), a supervisor passes
the signal to its child, which saves at the next step boundary as it does alone, and restarts nothing more.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.forkserver
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from ddp_trainer import fence, gang
from ddp_trainer.launch import Launch
from ddpjob_contract import exits
from ddpjob_contract.pods import ENV_RESTART_COUNT, ENV_RESTART_REASON

PRELOAD = ("ddp_trainer.train", "torch._dynamo")
"""What the fork server imports once, so that no child pays for it."""
_STOPS = (signal.SIGTERM, signal.SIGINT)
FOLLOW_SECONDS = 2.0
"""How long a supervisor whose child lost a peer waits for the gang's word before it announces a restart itself."""
_OOM_COUNTERS = (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control"))
"""The container's memory cgroup, v2 then v1: each has an ``oom_kill N`` line."""
_PR_SET_PDEATHSIG = 1


def retryable(exitcode: int) -> bool:
    """Whether a child's end is one that a restart of the gang can fix: the trainer's code for a lost peer or a
    collective timeout, or a kill by a signal other than a stop (a negative multiprocessing exit code)."""
    if exitcode < 0:
        return -exitcode not in _STOPS
    return exitcode == exits.EXIT_RETRYABLE


def exit_status(exitcode: int) -> int:
    """The supervisor's own exit status for its child's multiprocessing exit code: 128 + N for signal N, as a
    shell reports it."""
    return exits.SIGNAL_EXIT_BASE - exitcode if exitcode < 0 else exitcode


def oom_kills(counters: Sequence[Path] = _OOM_COUNTERS) -> int:
    """The OOM killer's kills so far in this container's memory cgroup; 0 where no counter can be read."""
    for path in counters:
        with contextlib.suppress(OSError):
            found = re.search(r"^oom_kill (\d+)$", path.read_text(), re.MULTILINE)
            if found:
                return int(found.group(1))
    return 0


def describe(rank: int, exitcode: int) -> str:
    if exitcode < 0:
        return f"rank {rank}'s training process was killed by {signal.Signals(-exitcode).name}"
    return f"rank {rank}'s training process exited {exitcode} (a lost peer or a collective timeout)"


def _child(argv: list[str], restart: int, why: str) -> None:
    """A training process: a process group of its own (so the supervisor can end it with its data loaders), ended
    with the fork server, then ``python -m ddp_trainer`` as without a supervisor."""
    os.setpgid(0, 0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.environ[ENV_RESTART_COUNT] = str(restart)
    os.environ[ENV_RESTART_REASON] = why  # with the count: a child never supervises itself (``launch.under_agent``)
    from ddp_trainer import program, signals

    signals.install()
    sys.exit(program.main(argv))


class Supervisor:
    def __init__(self, argv: Sequence[str], rank: int, max_restarts: int, the_gang: gang.Gang) -> None:
        self._argv = list(argv)
        self._rank = rank
        self._max = max_restarts
        self._gang = the_gang
        self._stop = 0
        self._signals = 0
        """Stop signals received; each is passed to the child once (a second one stops it at once)."""
        self._passed = 0
        self._stop_read, self._stop_write = os.pipe()
        self._context = multiprocessing.get_context("forkserver")

    def run(self) -> int:
        for signum in _STOPS:
            signal.signal(signum, self._on_stop)
        restart = 0
        while not self._stop:
            ooms = oom_kills()
            child = self._start(restart)
            peer_failed = self._watch(child, restart)
            self._end(child)  # and its data loaders, if they outlived it
            assert child.exitcode is not None
            code = child.exitcode
            if not peer_failed:  # else this child's collectives would only have hung: restart it with the gang
                if code == exits.EXIT_OK or self._stop or self._gang.stopped():
                    return exit_status(code)
                why_not = self._why_not(code, oom=oom_kills() > ooms, restart=restart)
                if why_not:
                    self._gang.stop(why_not)
                    print(f"ddp_trainer: {why_not}: not restarted in place", file=sys.stderr, flush=True)
                    return exit_status(code)
                if code == exits.EXIT_RETRYABLE:
                    self._wait_for_news(restart, FOLLOW_SECONDS)  # the rank that failed says what it does
                if self._gang.heard() <= restart and not self._gang.stopped():
                    self._gang.announce(restart + 1, describe(self._rank, code))
            newest = self._next(restart)
            if newest == restart:  # the gang stopped restarting in place, or this supervisor was asked to stop
                return exit_status(code)
            restart = newest
        return exits.SIGNAL_EXIT_BASE + self._stop

    def _why_not(self, code: int, *, oom: bool, restart: int) -> str:
        """Why this child's end restarts nothing in place (empty: it may)."""
        if not retryable(code):
            return f"rank {self._rank}'s training process exited {code}"
        if oom and code == -signal.SIGKILL:
            # Said as the kubelet says it (OOMKilled, with the limit), by ending the container.
            return f"rank {self._rank}'s training process was killed by the OOM killer (over its memory limit)"
        if restart >= self._max:
            return f"rank {self._rank}'s training process failed again after {self._max} restarts in place"
        return ""

    def _wait_for_news(self, restart: int, seconds: float) -> None:
        """Wait up to ``seconds`` for a restart past ``restart`` or a stop (a peer lost by the rank that failed, who
        announces it at once; a collective timed out where no rank failed: nobody does)."""
        deadline = time.monotonic() + seconds
        while self._gang.heard() <= restart and not self._gang.stopped() and not self._stop:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            wait([self._gang.wakeup_fd(), self._stop_read], timeout=left)
            _empty(self._gang.wakeup_fd())

    def _start(self, restart: int) -> Any:
        why = self._gang.why(restart)
        child = self._context.Process(target=_child, args=(self._argv, restart, why), name=f"train-{restart}")
        child.start()
        self._passed = 0
        return child

    def _watch(self, child: Any, restart: int) -> bool:
        """Until the child exits (False), or a restart past ``restart`` is heard while no stop was asked (True).
        Passes each stop signal to the child once."""
        gang_fd = self._gang.wakeup_fd()
        while True:
            while self._passed < self._signals:
                self._passed += 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, self._stop)  # it saves at its next step boundary, as it does alone
            ready = wait([child.sentinel, gang_fd, self._stop_read])
            if child.sentinel in ready:
                return False
            if self._gang.heard() > restart and not self._stop and not self._gang.stopped():
                return True
            _empty(self._stop_read)
            _empty(gang_fd)  # stopping: a restart heard now changes nothing

    def _next(self, restart: int) -> int:
        """Wait for the announcement past ``restart`` (or a stop), say it, and return the newest restart heard."""
        while self._gang.heard() <= restart and not self._stop and not self._gang.stopped():
            wait([self._gang.wakeup_fd(), self._stop_read])
        _empty(self._gang.wakeup_fd())
        newest = self._gang.heard()
        if newest > restart:
            why = self._gang.why(newest)
            print(f"ddp_trainer: {why}: restarting the gang in place ({newest} of {self._max})", file=sys.stderr)
        return newest

    def _end(self, child: Any) -> None:
        """SIGKILL the child and its process group (its data loaders): the group may not exist yet (a child just
        started) or any more (every member gone)."""
        for kill in (os.kill, os.killpg):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(child.pid, signal.SIGKILL)
        child.join()

    def _on_stop(self, signum: int, _frame: object) -> None:
        """Only notes the signal: the loop passes it on (a handler must not read the child's state)."""
        self._stop = signum
        self._signals += 1
        os.write(self._stop_write, b"s")


def _empty(fd: int) -> None:
    """Read whatever a wake-up pipe holds (the news itself is kept elsewhere)."""
    os.set_blocking(fd, False)
    try:
        with contextlib.suppress(BlockingIOError):
            while os.read(fd, 64):
                pass
    finally:
        os.set_blocking(fd, True)


def supervise(argv: Sequence[str], launch: Launch, max_restarts: int, connect_timeout: float) -> int:
    """Run ``python -m ddp_trainer argv`` in children, restarting the gang in place up to ``max_restarts`` times.
    ``connect_timeout``: how long to wait for rank 0's supervisor (the process group's own timeout)."""
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    multiprocessing.forkserver.ensure_running()  # it imports while this process sets up the gang
    the_gang: gang.Gang = gang.Alone()
    if launch.distributed:
        # A supervisor of an earlier attempt (its pod deleted on a node cut off from the apiserver) never joins
        # the gang, where its end would stop the current gang's restarts in place.
        try:
            fence.for_rank(launch.rank_addr, launch.pod_ips, launch.rank).wait_until_current(connect_timeout)
        except fence.Fenced as err:
            print(f"ddp_trainer: {err}", file=sys.stderr, flush=True)
            return exits.EXIT_PERMANENT
        port = launch.master_port + gang.STORE_PORT_OFFSET
        if launch.rank == 0:
            gang.Server(port)  # serves from its own threads for the life of the process
        the_gang = gang.Member(launch.master_addr, port, launch.rank, connect_timeout)
    return Supervisor(argv, launch.rank, max_restarts, the_gang).run()
