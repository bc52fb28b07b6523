"""Per-iteration timing on a Prometheus endpoint. Torch-free: it records floats it is given.

Histograms and counters only; rates and quantiles are PromQL's job. The names are the
constants in ``ddpjob_contract.metrics`` (re-exported here).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.process_collector import ProcessCollector

from ddp_trainer.readers import Linger, Readers
from ddpjob_contract.metrics import (
    ALL,
    CHECKPOINT_SAVE_SECONDS,
    INFO,
    LAST_CHECKPOINT_STEP,
    LAST_CHECKPOINT_TIMESTAMP_SECONDS,
    LAST_STEP_TIMESTAMP_SECONDS,
    LOSS,
    PHASE_LABEL,
    PHASE_SECONDS,
    PHASES,
    PROCESS_GROUP_READY,
    RESTART_COUNT,
    RESTART_INFO,
    SAMPLES_TOTAL,
    STEP,
    STEP_SECONDS,
    STEPS_TOTAL,
    TARGET_STEP,
)

__all__ = ["ALL", "PHASES", "Metrics", "StepTiming"]

# From a tiny CNN on CPU (milliseconds) to ResNet-50 on a slow CPU (tens of seconds), and the first step of a
# compiled run (torch.compile's minutes, in the top buckets rather than +Inf).
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_PHASE_BUCKETS = (0.0005, 0.001, *_STEP_BUCKETS)


@dataclass(frozen=True, kw_only=True)
class StepTiming:
    """One finished optimizer step, as measured by ``timing``."""

    step: int
    samples: int
    step_seconds: float  # NaN when the step was not timed (--no-step-timing), like its phases and loss
    phase_seconds: Mapping[str, float]
    loss: float

    @property
    def timed(self) -> bool:
        return not math.isnan(self.step_seconds)


@dataclass(frozen=True, kw_only=True)
class Saved:
    """The newest complete checkpoint this process saved or resumed from."""

    step: int
    saved_at: float
    """Unix time (0: unknown)."""
    save_seconds: float | None
    """How long this run took to save it (None: resumed from)."""


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape on the trainer's output."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Metrics:
    """The trainer's metrics in a registry of their own (tests can hold several in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.readers = Readers()
        self.newest_checkpoint: Saved | None = None
        ProcessCollector(registry=self.registry)
        self.step_seconds = Histogram(
            _base(STEP_SECONDS, ""),
            "Wall time of a whole training iteration (one optimizer step), data wait included.",
            buckets=_STEP_BUCKETS,
            registry=self.registry,
            unit="seconds",
        )
        self.phase_seconds = Histogram(
            _base(PHASE_SECONDS, ""),
            "Time of each phase of an iteration: data (wait for the input), forward, backward "
            "(includes the overlapped gradient all-reduce), optimizer.",
            [PHASE_LABEL],
            buckets=_PHASE_BUCKETS,
            registry=self.registry,
            unit="seconds",
        )
        self.steps = Counter(
            _base(STEPS_TOTAL, "_total"), "Optimizer steps done by this process.", registry=self.registry
        )
        self.samples = Counter(
            _base(SAMPLES_TOTAL, "_total"), "Samples this process has trained on.", registry=self.registry
        )
        self.step = Gauge(STEP, "The training step reached (restored on resume).", registry=self.registry)
        self.target_step = Gauge(TARGET_STEP, "The step the run ends at; 0 until known.", registry=self.registry)
        self.last_step = Gauge(LAST_STEP_TIMESTAMP_SECONDS, "Unix time the last step finished.", registry=self.registry)
        self.loss = Gauge(LOSS, "Loss of the last step on this rank.", registry=self.registry)
        self.last_checkpoint_step = Gauge(
            LAST_CHECKPOINT_STEP, "Step of the newest checkpoint saved or resumed from.", registry=self.registry
        )
        self.last_checkpoint_time = Gauge(
            LAST_CHECKPOINT_TIMESTAMP_SECONDS, "Unix time that checkpoint was saved.", registry=self.registry
        )
        self.checkpoint_save_seconds = Gauge(
            CHECKPOINT_SAVE_SECONDS, "Wall time of this run's last checkpoint save, all ranks.", registry=self.registry
        )
        self.restart_count = Gauge(
            RESTART_COUNT, "In-place restarts of the gang's processes before this one.", registry=self.registry
        )
        self.restart = Info(
            _base(RESTART_INFO, "_info"), "Why the gang's processes last restarted in place.", registry=self.registry
        )
        self.pg_ready = Gauge(PROCESS_GROUP_READY, "1 once init_process_group has returned.", registry=self.registry)
        self.info = Info(_base(INFO, "_info"), "Static facts about this training run.", registry=self.registry)
        for phase in PHASES:  # export every series from the start, at zero
            self.phase_seconds.labels(phase)

    def serve(self, port: int) -> None:
        """Serve /metrics on daemon threads, which die with the process; each request is counted in ``readers``."""
        app = make_wsgi_app(self.registry)
        readers = self.readers

        def counted(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            readers.read(str(environ.get("REMOTE_ADDR", "")), str(environ.get("HTTP_USER_AGENT", "")))
            served: Iterable[bytes] = app(environ, start_response)
            return served

        server = make_server("0.0.0.0", port, counted, ThreadingWSGIServer, handler_class=_Quiet)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()

    def linger(self, limit: float) -> Linger:
        """After the last step: serve until the readers have read the final values, at most ``limit`` seconds."""
        return self.readers.linger(limit)

    def record(self, timing: StepTiming) -> None:
        """Count the step; observe its times and loss when it was timed."""
        if timing.timed:
            self.step_seconds.observe(timing.step_seconds)
            for phase in PHASES:
                self.phase_seconds.labels(phase).observe(timing.phase_seconds.get(phase, 0.0))
            self.loss.set(timing.loss)
        self.steps.inc()
        self.samples.inc(timing.samples)
        self.step.set(timing.step)
        self.last_step.set(time.time())

    def checkpointed(self, step: int, saved_at: float, save_seconds: float | None = None) -> None:
        """A checkpoint of ``step`` exists (saved at Unix time ``saved_at``; ``save_seconds``: by this run)."""
        self.newest_checkpoint = Saved(step=step, saved_at=saved_at, save_seconds=save_seconds)
        self.last_checkpoint_step.set(step)
        self.last_checkpoint_time.set(saved_at)
        if save_seconds is not None:
            self.checkpoint_save_seconds.set(save_seconds)


def _base(name: str, suffix: str) -> str:
    """prometheus-client appends the unit and type suffixes itself; give it the stem."""
    stem = name.removesuffix(suffix)
    return stem.removesuffix("_seconds") if name.endswith("_seconds") else stem
