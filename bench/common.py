"""What every benchmark shares: the measured window, paired repetitions, statistics and the output files.

The machine is noisy and shared, so no figure stands alone: each is a ratio of two variants run in
the same invocation, alternated (A B, then B A, so neither always goes first), after a warm-up,
repeated at least five times. We report the median of the per-pair ratios and their range.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
MIN_REPEATS = 5


class BenchError(Exception):
    """A run failed; the message names the command and ends with its output's tail."""


# ---------------------------------------------------------------- inside a measured process


@dataclass
class Window:
    """Time from the end of step ``warmup`` to the end of step ``warmup + measure`` (steps count from 1).

    Two clocks: wall time, and this process's CPU time (all its threads). On a shared machine the
    wall clock also counts other tenants' work; CPU time counts only ours, so ratios of it are far
    steadier. ``sync`` waits for the device at both ends (two synchronizations per run, none per
    step), so on a GPU the window holds exactly the device work of ``measure`` steps.
    ``on_open``/``on_close`` run inside the window's edges, after the opening sync and before the
    closing one.
    """

    warmup: int
    measure: int
    sync: Callable[[], None] = lambda: None
    on_open: Callable[[], None] = lambda: None
    on_close: Callable[[], None] = lambda: None
    opened: float = 0.0
    closed: float = 0.0
    cpu_opened: float = 0.0
    cpu_closed: float = 0.0

    def step_done(self, step: int) -> None:
        if step == self.warmup:
            self.sync()
            self.opened, self.cpu_opened = time.perf_counter(), time.process_time()
            self.on_open()
        elif step == self.warmup + self.measure:
            self.on_close()
            self.sync()
            self.closed, self.cpu_closed = time.perf_counter(), time.process_time()

    @property
    def total_steps(self) -> int:
        return self.warmup + self.measure

    @property
    def seconds(self) -> float:
        if not self.closed:
            raise BenchError(f"the measured window never closed: fewer than {self.total_steps} steps ran")
        return self.closed - self.opened

    @property
    def cpu_seconds(self) -> float:
        _ = self.seconds  # the same check
        return self.cpu_closed - self.cpu_opened

    def figures(self, samples_per_step: int, world_size: int) -> dict[str, float]:
        """Global img/s by the wall clock, and images per CPU-second of this process (one rank)."""
        return {
            "img_per_s": self.measure * samples_per_step * world_size / self.seconds,
            "img_per_cpu_s": self.measure * samples_per_step / self.cpu_seconds if self.cpu_seconds > 0 else 0.0,
            "step_ms": 1000 * self.seconds / self.measure,
            "cpu_ms_per_step": 1000 * self.cpu_seconds / self.measure,
        }


def emit(result: Mapping[str, Any]) -> None:
    """The one line a measured process prints for its driver."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def device_sync(device_type: str) -> Callable[[], None]:
    if device_type != "cuda":
        return lambda: None
    import torch

    return torch.cuda.synchronize


# ---------------------------------------------------------------- in the driver


def run_child(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    """Run a measured process and return the result it emitted."""
    child_env = {**hermetic_environ(), **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *(p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    )
    # torchrun leaves its log directory (torchelastic_*) in the temporary directory: this run's own, removed after.
    with tempfile.TemporaryDirectory(prefix="ddpjob-bench-") as scratch:
        child_env["TMPDIR"] = scratch
        try:
            done = subprocess.run(
                list(argv), env=child_env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise BenchError(f"{' '.join(argv)} ran past {timeout:.0f}s") from None
    output = done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        tail = "\n".join(output.splitlines()[-25:])
        raise BenchError(f"{' '.join(argv)} exited {done.returncode} without a result:\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix(RESULT_PREFIX))
    return result


def hermetic_environ() -> dict[str, str]:
    """This process's environment without anything that would change what a trainer run does:
    no launcher variables (it would join a process group), no TRAIN_* options, no injected defaults."""
    dropped = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CHECKPOINT_DIR", "METRICS_PORT"}
    return {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("TRAIN_")}


def alternate(repeats: int, variants: Mapping[str, Callable[[], dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Run every variant once per repetition, in an order that flips each time (A B, B A, ...)."""
    names = list(variants)
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rep in range(repeats):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            started = time.monotonic()
            result = variants[name]()
            out[name].append(result)
            log(f"  rep {rep + 1}/{repeats} {name}: {describe(result)} ({time.monotonic() - started:.0f}s)")
    return out


def describe(result: Mapping[str, Any]) -> str:
    if "img_per_cpu_s" in result:
        return f"{result['img_per_s']:.1f} img/s, {result['img_per_cpu_s']:.1f} img per CPU-second"
    if "img_per_s" in result:
        return f"{result['img_per_s']:.1f} img/s"
    return ", ".join(f"{k}={v}" for k, v in result.items() if isinstance(v, int | float))[:120]


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    values: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values), [round(v, 4) for v in values])

    def show(self, digits: int = 3) -> str:
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> Spread:
    """Ratios a_i / b_i of the runs taken side by side in repetition i."""
    return Spread.of([x / y for x, y in zip(a, b, strict=True)])


METRICS = {"img_per_s": "img/s (wall clock)", "img_per_cpu_s": "img per CPU-second (this process)"}


def compare(runs: Mapping[str, list[dict[str, Any]]], a: str, b: str) -> dict[str, Spread]:
    """Paired ratios a/b of each metric the runs report (wall-clock and CPU-time throughput)."""
    return {
        metric: paired_ratios([r[metric] for r in runs[a]], [r[metric] for r in runs[b]])
        for metric in METRICS
        if all(metric in r for r in (*runs[a], *runs[b]))
    }


def throughput_rows(runs: Mapping[str, list[dict[str, Any]]]) -> list[list[str]]:
    """One row per variant: median (range) of each metric, and the median step time."""
    rows = []
    for name, rs in runs.items():
        cells = [Spread.of([r[m] for r in rs]).show(1) if all(m in r for r in rs) else "" for m in METRICS]
        rows.append([name, *cells, f"{Spread.of([r['step_ms'] for r in rs]).median:.1f}"])
    return rows


THROUGHPUT_HEADERS = ["variant", *(f"{label}, median (range)" for label in METRICS.values()), "step ms, median"]


def throughput_report(heading: str, runs: Mapping[str, list[dict[str, Any]]], notes: Sequence[str]) -> str:
    """The markdown of a throughput comparison: the heading, the table of every variant, then the notes, one a line."""
    return "\n".join([heading, "", table(THROUGHPUT_HEADERS, throughput_rows(runs)), "", *notes])


def ratio_lines(label: str, ratios: Mapping[str, Spread], target: float, pairs: int) -> list[str]:
    return [
        f"- {label}, {METRICS[m].split(' (')[0]}: **{r.show()}** over {pairs} pairs; target >= {target}: "
        f"**{verdict(r.median, target)}**"
        for m, r in ratios.items()
    ]


Target = tuple[str, float, str, str]
"""A row of ``run_all``'s summary: the figure, its value, the target and the verdict."""


def ratio_targets(label: str, ratios: Mapping[str, Spread], target: float) -> list[Target]:
    clock = {"img_per_s": "wall clock", "img_per_cpu_s": "CPU time"}
    return [(f"{label} ({clock[m]})", r.median, f">= {target}", verdict(r.median, target)) for m, r in ratios.items()]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), interpolated linearly between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def verdict(value: float, target: float, *, at_most: bool = False) -> str:
    met = value <= target if at_most else value >= target
    return "met" if met else "MISSED"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


TRAINER_PACKAGES = ("torch", "torchvision")
"""What a benchmark that runs the trainer, or reads its checkpoints, on this host imports: the ``trainer`` extra,
which ``make setup`` and ``make test`` install and ``make demo`` does not (its venv runs the box and the chart)."""


def need_trainer(command: str) -> None:
    """Stop before anything runs, in one line, when this virtualenv lacks the trainer's packages."""
    missing = [name for name in TRAINER_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"{command} needs {' and '.join(missing)}, which this virtualenv lacks (`make demo` installs only what "
            "the box and the chart need): run `make setup`, which installs them, then run it again"
        )


def machine() -> dict[str, Any]:
    """Where the figures were taken: they mean little without it."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_results(name: str, data: Mapping[str, Any], markdown: str, out_dir: Path = RESULTS_DIR) -> Path:
    """``<out_dir>/<name>.json`` (everything) and ``<name>.md`` (the table); returns the markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    path = out_dir / f"{name}.md"
    path.write_text(markdown.rstrip() + "\n")
    return path


def publish(name: str, data: Mapping[str, Any], markdown: str, out_dir: Path, targets: list[Target]) -> dict[str, Any]:
    """Writes the results files, prints the markdown, and returns what ``run_all`` summarises."""
    write_results(name, data, markdown, out_dir)
    print(markdown)
    return {"name": name, "markdown": markdown, "targets": targets}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Spread):
        return asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


STOPPING = threading.Event()
"""Set when the driver is interrupted (Ctrl-C, SIGTERM): every ``wait_until`` in a worker thread ends at once,
so the driver's pool, and with it the box, can stop now rather than when each wait times out."""


def wait_until(what: str, probe: Callable[[], Any], deadline: Callable[[], float], *, interval: float = 0.5) -> Any:
    """``probe``'s first truthy answer, asked every ``interval`` s until the monotonic time passes ``deadline()``;
    KeyboardInterrupt once STOPPING is set."""
    started = time.monotonic()
    while True:
        if STOPPING.is_set():
            raise KeyboardInterrupt(f"stopped while waiting for {what}")
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline():
            raise TimeoutError(f"timed out after {time.monotonic() - started:.0f}s waiting for {what}")
        time.sleep(interval)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def stop_on_sigterm() -> None:
    """SIGTERM (``timeout``, ``kill``) takes the Ctrl-C path, so the box and the children are torn down."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
