"""The exported metric names are the contract's, with counts that follow the recorded steps."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ddp_trainer.metrics import Metrics, StepTiming
from ddp_trainer.readers import Readers
from ddpjob_contract import metrics as names
from tests.trainer.procs import free_ports


def families(m: Metrics) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = generate_latest(m.registry).decode()
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def sample(m: Metrics, name: str, **labels: str) -> float:
    for fam in families(m).values():
        for sname, slabels, value in fam:
            if sname == name and slabels == labels:
                return value
    raise KeyError(name)


def step(n: int) -> StepTiming:
    phases = {"data": 0.001, "forward": 0.01, "backward": 0.02, "optimizer": 0.003}
    return StepTiming(step=n, samples=32, step_seconds=0.034, phase_seconds=phases, loss=2.5)


def test_the_contract_modules_import_without_torch() -> None:
    import subprocess
    import sys

    modules = "metrics, config, launch, errors, signals, __main__"
    code = (
        f"import sys; import ddpjob_contract.metrics; from ddp_trainer import {modules}; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_contract_metric_is_exported_before_the_first_step() -> None:
    m = Metrics()
    exported = {s[0] for fam in families(m).values() for s in fam}
    for name in (names.STEPS_TOTAL, names.SAMPLES_TOTAL, names.LOSS, names.PROCESS_GROUP_READY):
        assert name in exported
    assert f"{names.STEP_SECONDS}_count" in exported
    for phase in names.PHASES:
        assert sample(m, f"{names.PHASE_SECONDS}_count", phase=phase) == 0
    assert names.LAST_STEP_TIMESTAMP_SECONDS in exported
    assert sample(m, names.TARGET_STEP) == 0, "0 until the run knows where it ends: no percent done yet"


def test_recording_steps_counts_steps_and_samples_and_observes_every_phase() -> None:
    m = Metrics()
    for n in range(1, 4):
        m.record(step(n))
    assert sample(m, names.STEPS_TOTAL) == 3
    assert sample(m, names.SAMPLES_TOTAL) == 96
    assert sample(m, f"{names.STEP_SECONDS}_count") == 3
    for phase in names.PHASES:
        assert sample(m, f"{names.PHASE_SECONDS}_count", phase=phase) == 3
    assert sample(m, names.LOSS) == 2.5
    assert sample(m, names.LAST_STEP_TIMESTAMP_SECONDS) > 0


def test_info_carries_the_run_facts_and_no_rank() -> None:
    m = Metrics()
    m.info.info({"world_size": "2", "backend": "gloo", "model": "tinycnn"})
    assert sample(m, names.INFO, world_size="2", backend="gloo", model="tinycnn") == 1
    assert "rank" not in names.INFO_LABELS


def test_the_step_gauge_is_the_training_step_even_when_a_resumed_process_counts_from_zero() -> None:
    m = Metrics()
    for n in (41, 42):  # a process resumed from the checkpoint of step 40
        m.record(step(n))
    assert sample(m, names.STEP) == 42
    assert sample(m, names.STEPS_TOTAL) == 2


def test_an_untimed_step_is_counted_but_observes_no_time_and_no_loss() -> None:
    m = Metrics()
    untimed = StepTiming(step=7, samples=32, step_seconds=float("nan"), phase_seconds={}, loss=float("nan"))
    m.record(untimed)
    assert sample(m, names.STEPS_TOTAL) == 1
    assert sample(m, names.SAMPLES_TOTAL) == 32
    assert sample(m, names.STEP) == 7
    assert sample(m, f"{names.STEP_SECONDS}_count") == 0
    assert sample(m, f"{names.PHASE_SECONDS}_count", phase="forward") == 0
    assert sample(m, names.LOSS) == 0


def _read(port: int, agent: str) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"User-Agent": agent})
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(response.read().decode())


@contextmanager
def _scraping(port: int, agent: str) -> Iterator[None]:
    """A reader that reads every 50 ms, as a Prometheus does every scrape interval."""
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(0.05):
            _read(port, agent)

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_linger_ends_once_prometheus_has_read_the_final_values_and_does_not_wait_for_the_operators_poll() -> None:
    m = Metrics()
    port = free_ports(1)
    m.serve(port)
    assert names.STEPS_TOTAL in _read(port, "Prometheus/3.16.0")
    _read(port, f"{names.POLLER_USER_AGENT}/0.1.0")  # the operator polled once, and will not again in time
    with _scraping(port, "Prometheus/3.16.0"):
        ended = m.linger(60)
    assert (ended.came_back, ended.missing) == (1, 0), ended


def test_a_reader_that_does_not_come_back_is_waited_for_no_longer_than_the_linger() -> None:
    readers = Readers()
    readers.read("10.0.0.7", "Prometheus/3.16.0")
    readers.read("10.0.0.8", "Prometheus/3.16.0")  # a second replica
    ended = readers.linger(0.2)
    assert (ended.came_back, ended.missing) == (0, 2)
    assert "2 reader(s) did not read the final values" in ended.line()


def test_with_no_reader_yet_a_linger_waits_for_a_first_one() -> None:
    """A short run may end before Prometheus has found its pod: the linger is its chance to read the run at all."""
    readers = Readers()
    reader = threading.Timer(0.3, readers.read, ("10.0.0.7", "Prometheus/3.16.0"))
    reader.start()
    ended = readers.linger(60)
    reader.join()
    assert (ended.came_back, ended.missing) == (1, 0), ended
    nobody = Readers().linger(0.1)
    assert (nobody.came_back, nobody.missing) == (0, 1)
