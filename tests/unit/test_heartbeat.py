"""Progress lines for a long call in this process (the demo's box start and helm install)."""

from __future__ import annotations

import io
import time

from ddpjob_box.heartbeat import heartbeat


def test_a_long_call_gets_a_line_per_interval_with_its_elapsed_time_and_figure() -> None:
    out = io.StringIO()
    with heartbeat("box start", lambda: "the node", out=out, every=0.05):
        time.sleep(0.18)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2
    assert all(line == "box start: 0s, the node" for line in lines)


def test_a_short_call_prints_nothing_and_the_beat_stops_with_it() -> None:
    out = io.StringIO()
    with heartbeat("helm install", out=out, every=0.2):
        pass
    time.sleep(0.3)
    assert out.getvalue() == ""
