"""The sync counter counts what a loop makes the host wait for inside the window, and nothing of the window's own.

On CPU nothing waits for a device, so the counter counts the calls that would on a GPU: the ops whose
result the host reads (``.item()`` reaches ``aten::_local_scalar_dense``), through a dispatch mode. The
window's opening and closing synchronize are stood in for by a ``.item()`` of their own, which the
counter must not see: ``Window`` starts it after the one and stops it before the other.
"""

from __future__ import annotations

import linecache
import warnings

import pytest
import torch

from bench.common import Window
from bench.loops import SyncCounter

WARMUP, MEASURE = 2, 4


def window_sync() -> None:
    torch.ones(()).item()  # what torch.cuda.synchronize() is to a GPU run: a wait the window itself makes


def run(loop_reads_at: set[int]) -> SyncCounter:
    """Steps of a tiny model through a window; step k reads its loss on the host if k is in ``loop_reads_at``."""
    counter = SyncCounter(torch.device("cpu"))
    window = Window(WARMUP, MEASURE, sync=window_sync, on_open=counter.start, on_close=counter.stop)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, WARMUP + MEASURE + 2):
        loss = model(torch.randn(8, 4)).square().mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if step in loop_reads_at:
            loss.item()
        window.step_done(step)
    return counter


def test_a_loop_that_never_reads_a_device_value_counts_zero_syncs() -> None:
    assert run(set()).count == 0


def test_a_loop_with_one_item_in_the_window_counts_one_sync_at_its_line() -> None:
    counter = run({WARMUP + 2})
    assert counter.count == 1
    ((site, n),) = counter.where.items()
    path, line = site.rsplit(":", 1)
    assert path == __file__ and linecache.getline(path, int(line)).strip() == "loss.item()", site
    assert n == 1


def test_reads_before_the_window_opens_or_after_it_closes_are_not_counted() -> None:
    assert run({1, WARMUP, WARMUP + MEASURE + 1}).count == 0


def test_a_warning_the_mode_switch_itself_raises_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an H200 (torch 2.11) each run counted one sync at the line of ``set_sync_debug_mode``: the switch's own."""

    def switch(mode: str) -> None:
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", switch)
    counter = SyncCounter(torch.device("cpu"))
    counter.on_gpu = True  # what a GPU run does, with the switch stood in for
    counter.start()
    warnings.warn("called a synchronizing CUDA operation", stacklevel=1)  # the loop's sync
    counter.stop()
    ((site, n),) = counter.where.items()
    path, line = site.rsplit(":", 1)
    assert (path, n) == (__file__, 1) and "the loop's sync" in linecache.getline(path, int(line)), site
