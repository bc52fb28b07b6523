"""Benchmark 2: what the trainer's metrics and timing cost.

    python -m bench.instrumentation

Three variants of the trainer are alternated, one process per run:

- ``on``: step timing on and ``--metrics-port`` set, scraped every few seconds as the box's
  Prometheus does (what a DDPJob runs);
- ``server off``: ``--metrics-port 0``, step timing still on;
- ``off``: ``--metrics-port 0 --no-step-timing``: no server, no clock or loss read per step.

Target: on / off >= 0.99. On / server off shows the server's share.
"""

from __future__ import annotations

import argparse
import threading
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import workload
from bench.common import (
    RESULTS_DIR,
    alternate,
    compare,
    log,
    machine,
    need_trainer,
    publish,
    ratio_lines,
    ratio_targets,
    run_child,
    throughput_report,
)
from bench.trainer_vs_plain import trainer_probe
from ddpjob_box.ports import free_port

NAME = "instrumentation"
TARGET = 0.99
SCRAPE_SECONDS = 2.0  # the box's Prometheus scrape interval (ddpjob_box.prometheus.SCRAPE_SECONDS)


class Scraper:
    """Fetches /metrics every ``interval`` seconds on a thread, like Prometheus, while a run lasts."""

    def __init__(self, port: int, interval: float) -> None:
        self.url, self.interval = f"http://127.0.0.1:{port}/metrics", interval
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    response.read()
                self.scrapes += 1
            except OSError:
                pass  # not listening yet, or already gone


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    need_trainer("python -m bench.instrumentation")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload.add_arguments(parser)
    parser.add_argument("--scrape-seconds", type=float, default=SCRAPE_SECONDS, help="scrape interval when on")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON and markdown")
    args = parser.parse_args(argv)
    w = workload.from_arguments(args)

    log(f"{NAME}: {w.describe()}, {args.repeats} rounds")

    def probe(*trainer_flags: str) -> list[str]:
        return [*trainer_probe(w), *trainer_flags]  # later flags win in argparse

    def on() -> dict[str, Any]:
        port = free_port()
        with Scraper(port, args.scrape_seconds) as scraper:
            result = run_child(probe(f"--metrics-port={port}"), env=w.env)
        return {**result, "scrapes": scraper.scrapes}

    runs = alternate(
        args.repeats,
        {
            "on": on,
            "server off": lambda: run_child(probe("--metrics-port=0"), env=w.env),
            "off": lambda: run_child(probe("--metrics-port=0", "--no-step-timing"), env=w.env),
        },
    )
    on_off = compare(runs, "on", "off")
    on_server_off = compare(runs, "on", "server off")
    scrapes = sum(r["scrapes"] for r in runs["on"])
    markdown = throughput_report(f"### Instrumentation overhead ({w.describe()})", runs, [
        f"The 'on' runs were scraped {scrapes} times in all, every {args.scrape_seconds:g}s. 'off' is "
        "`--metrics-port 0 --no-step-timing`; 'server off' keeps the step timing.",
        "",
        *ratio_lines("timing and metrics on / off", on_off, TARGET, args.repeats),
        *ratio_lines("on / server off (timing on in both)", on_server_off, TARGET, args.repeats),
    ])  # fmt: skip
    data = {"name": NAME, "workload": asdict(w), "machine": machine(), "runs": runs, "on_over_off": on_off,
            "on_over_server_off": on_server_off, "target": TARGET,
            "scrape_seconds": args.scrape_seconds}  # fmt: skip
    return publish(NAME, data, markdown, args.out, ratio_targets("timing+metrics on / off", on_off, TARGET))


if __name__ == "__main__":
    main()
