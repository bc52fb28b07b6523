"""Box components: started by a thread that outlives whoever asks, and started again when they exit on their own."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ddpjob_box.processes import Component, Supervisor, last_error


def python(name: str, code: str, tmp_path: Path) -> Component:
    return Component(name, [sys.executable, "-c", code], tmp_path / f"{name}.log")


@contextmanager
def supervised(component: Component) -> Iterator[list[str]]:
    """``component`` started, under a Supervisor that looks every 0.05 s; yields the lines it says."""
    said: list[str] = []
    component.start()
    supervisor = Supervisor([component], said.append, period=0.05)
    try:
        yield said
    finally:
        supervisor.stop()
        component.stop()


def until(what: str, predicate: object, timeout: float = 20.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_component_started_by_a_thread_that_ends_keeps_running(tmp_path: Path) -> None:
    # The kernel's parent-death signal follows the thread that forked: a component started again from a
    # short-lived thread (the chaos soak's workers restart etcd and kubelet) was killed when that thread ended.
    component = python("sleeper", "import time; time.sleep(60)", tmp_path)
    starter = threading.Thread(target=component.start)
    starter.start()
    starter.join()
    time.sleep(0.5)
    try:
        assert component.alive(), "the component died with the thread that started it"
    finally:
        component.stop()


def test_a_component_that_exits_on_its_own_is_started_again_and_said(tmp_path: Path) -> None:
    marks = tmp_path / "starts"
    code = f"open({str(marks)!r}, 'a').write('x'); import time; time.sleep(0.2); raise SystemExit(3)"
    component = python("crasher", code, tmp_path)
    with supervised(component) as said:
        until("two restarts", lambda: component.restarts >= 2)
        until("the third start's mark", lambda: marks.read_text().count("x") >= 3)
    assert re.match(r"crasher exited with code 3 after \d+s; the box started it again \(restart 1\)", said[0]), said
    assert "--- box: crasher exited with code 3" in component.log_path.read_text()


def test_a_component_stopped_on_purpose_stays_stopped(tmp_path: Path) -> None:
    component = python("sleeper", "import time; time.sleep(60)", tmp_path)
    with supervised(component) as said:
        component.stop()
        time.sleep(1.5)  # past the first backoff (1 s)
        assert not component.alive() and said == [] and component.restarts == 0
        component.start()  # a restart on purpose, as the chaos soak's: the supervisor does not add one
        time.sleep(0.3)
        assert component.alive() and component.restarts == 0


def test_a_component_that_keeps_exiting_waits_longer_each_time(tmp_path: Path) -> None:
    component = python("crasher", "raise SystemExit(1)", tmp_path)
    with supervised(component) as said:
        until("the third exit's wait", lambda: len(component.backoffs) >= 3)
    assert component.backoffs[:3] == [1.0, 2.0, 4.0], said
    assert component.restarts == 2, "the third wait (4 s) had not passed when the test stopped"


def test_a_component_that_exits_after_a_klog_error_is_said_with_that_error(tmp_path: Path) -> None:
    # The real kube-scheduler exits right after: E1125 16:53:51.344887   18565 cache.go:662] "Pod updated on a
    # different node than previously added to. Scheduler cache is corrupted ..." podKey="49e5..." pod="chaos/x-0"
    line = 'E1125 16:53:51.344887   18565 cache.go:662] "Pod updated on a \\"node\\"" podKey="49e5" pod="chaos/x-0"'
    code = f"print({line!r}); print('I1125 16:53:51.4   18565 server.go:1] \"bye\"'); raise SystemExit(1)"
    component = python("scheduler", code, tmp_path)
    with supervised(component) as said:
        until("a restart", lambda: component.restarts >= 1)
    assert re.match(
        r'scheduler exited with code 1 after \d+s \(its last error: "Pod updated on a \\"node\\""\); ', said[0]
    ), said


def test_the_last_error_is_the_last_e_or_f_line_since_the_components_start(tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    log.write_text('E1125 10:00:00.1   7 a.go:1] "before the start"\n')
    since = log.stat().st_size
    assert last_error(log, since) == ""
    with log.open("a") as out:
        out.write('E1125 10:00:01.1   7 b.go:2] "Failed to watch" err="x"\nW1125 10:00:02.1   7 c.go:3] "warned"\n')
        out.write('F1125 10:00:03.1   7 d.go:4] plain fatal text\nI1125 10:00:04.1   7 e.go:5] "info"\n')
    assert last_error(log, since) == "plain fatal text"
    with log.open("a") as out:
        out.write("".join(f'I1125 10:00:0{i}.1   7 f.go:6] "fine"\n' for i in range(3)))
    assert last_error(log, since) == "", "an error long before the exit is not why it exited"
    assert last_error(tmp_path / "missing.log") == ""
