"""``ddpjob operator`` as its own process, as users run it, against a box: for the demo, tests and benchmarks.

It dies with the process that started it (PR_SET_PDEATHSIG), so a killed demo or test run leaves
no operator behind; ``stop`` asks it to finish (SIGTERM, which Kopf handles), then kills it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ddpjob_box.processes import spawn, tail
from ddpjob_contract import faults as operator_faults

REPO = Path(__file__).resolve().parents[2]
# Kopf's log lines for a request it is about to try again (kopf/_cogs/clients/api.py).
_KOPF_RETRY = re.compile(r"Request attempt #\S+ failed; (will retry|(TCP|SSL) closed; will re-authenticate)")


def error_lines(log: str) -> list[str]:
    """The lines of an operator's log that report an error or a traceback.

    Kopf's lines for a request it tries again are not counted: "Request attempt #1/9 failed; will
    retry" (for instance a 429 while the apiserver re-initializes the CRD's storage after another test
    re-applied the CRD), and "...failed; TCP closed; will re-authenticate" (its session closed while it
    waited to retry, as when the operator stops). A request that keeps failing ends in a line this
    still counts ("failed; escalating", or a traceback).
    """
    return [
        line for line in log.splitlines() if ("ERROR" in line or "Traceback" in line) and not _KOPF_RETRY.search(line)
    ]


class OperatorProcess:
    """``namespaces`` empty: all of them. ``metrics_port`` 0 and ``liveness`` "": no servers. ``faults``: the
    points where it exits as if killed (``DDPJOB_FAULTS``, e.g. ``pod-created:2``), for crash tests. ``extra_args``:
    more flags (``--leader-elect``...)."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        *,
        namespaces: Sequence[str] = (),
        metrics_port: int = 0,
        liveness: str = "",
        workers: int = 0,
        faults: str = "",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.log_path = log_path
        argv = [sys.executable, "-m", "ddpjob_operator", "operator"]
        argv += [f"--namespace={ns}" for ns in namespaces] or ["--all-namespaces"]
        argv += ["--metrics-port", str(metrics_port), "--liveness", liveness]
        if workers:
            argv += ["--workers", str(workers)]
        argv += extra_args
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
        env[operator_faults.ENV] = faults
        with open(log_path, "wb") as log:
            # In its own session: a Ctrl-C at the terminal reaches us, and we stop it in order.
            self.proc = spawn(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_path, lines)

    def errors(self) -> list[str]:
        """Lines where it logged an error or a traceback (``error_lines``)."""
        return error_lines(self.log())

    def stop(self, grace: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
