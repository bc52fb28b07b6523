"""Faults in the box's environment give one clear line naming cause and fix, and leave nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpjob_box import images, toolchain
from ddpjob_box.controlplane import LOCK_FILE, ControlPlane, claim_data_dir, lock_line, sweep_killed_boxes
from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode.leftovers import RECORD
from ddpjob_box.processes import exited, tail

REPO = Path(__file__).resolve().parents[2]


def _box_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "box"))
    env.update(extra)
    return env


def _processes_mentioning(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def test_a_missing_go_toolchain_is_named_with_the_fix(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddpjob_box.toolchain"],
        capture_output=True,
        text=True,
        env=_box_env(PATH="/nonexistent", DDPJOB_CACHE=str(tmp_path)),
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], "one line, no traceback"
    assert "Go toolchain is missing" in proc.stderr and "install Go" in proc.stderr


def test_a_failed_module_download_says_so_and_how_to_retry(tmp_path: Path) -> None:
    go_bin = Path(
        subprocess.run(
            ["bash", "-lc", "command -v go || echo /usr/local/go/bin/go"], capture_output=True, text=True
        ).stdout.strip()
    ).parent
    proc = subprocess.run(
        [sys.executable, "-m", "ddpjob_box.toolchain"],
        capture_output=True,
        text=True,
        env=_box_env(
            PATH=f"{go_bin}:/usr/bin:/bin",
            DDPJOB_CACHE=str(tmp_path),
            GOPROXY="off",
            GOMODCACHE=str(tmp_path / "mod"),
            GOFLAGS="-modcacherw",
        ),
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "downloading Go modules" in last and "retry 'make tools'" in last


def test_a_taken_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        plane = ControlPlane(data_dir=tmp_path / "box", apiserver_port=port)
        with pytest.raises(BoxError, match=rf"port {port} on 127.0.0.1 for kube-apiserver is already in use"):
            plane.start()
    assert not (tmp_path / "box").exists()


def test_a_data_dir_left_by_a_killed_run_is_explained_and_reset_on_request(tmp_path: Path) -> None:
    data_dir = tmp_path / "box"
    data_dir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (data_dir / LOCK_FILE).write_text(f"{dead.pid} 0\n")
    (data_dir / "etcd").mkdir()
    with pytest.raises(BoxError, match=r"left by a run that was killed .* pass --reset"):
        claim_data_dir(data_dir, reset=False)
    claim_data_dir(data_dir, reset=True)
    assert not (data_dir / "etcd").exists()
    assert (data_dir / LOCK_FILE).read_text().split()[0] == str(os.getpid())


def test_the_temp_dir_of_a_box_killed_outright_is_swept_and_no_other(tmp_path: Path) -> None:
    """A SIGKILL of the whole session runs no ``finally``: the next box to start undoes what that one left."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        owners = {
            "ddpjob-chaos-killed": f"{dead.pid} 0\n",
            "ddpjob-box-running": lock_line(live.pid),
            "ddpjob-box-reused-pid": f"{live.pid} 0\n",  # the pid now names another process
            "someone-elses-killed": f"{dead.pid} 0\n",  # not a box's temp dir
            "ddpjob-box-starting": "",  # no lock yet: a box between mkdtemp and its claim
        }
        for name, owner in owners.items():
            (tmp_path / name / "box" / "etcd").mkdir(parents=True)
            if owner:
                (tmp_path / name / "box" / LOCK_FILE).write_text(owner)
        swept = sweep_killed_boxes(tmp_path)
        assert sorted(p.name for p in swept) == ["ddpjob-box-reused-pid", "ddpjob-chaos-killed"]
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "ddpjob-box-running", "ddpjob-box-starting", "someone-elses-killed"
        ]  # fmt: skip
        assert live.poll() is None, "the box never kills a process it did not start"
    finally:
        live.kill()
        live.wait()


def test_a_sweep_beside_boxes_that_start_and_stop_neither_fails_nor_removes_a_live_one(tmp_path: Path) -> None:
    """Every box sweeps at its start, while other boxes claim their data directories and remove them (make
    test's workers, the chaos soak). A lock that vanished after the sweep listed it, or was read between its
    creation and its first write, must be left to its owner."""
    stop = threading.Event()
    lost: list[str] = []

    def boxes_coming_and_going() -> None:
        number = 0
        while not stop.is_set():
            number += 1
            data_dir = tmp_path / f"ddpjob-box-{number}" / "box"
            data_dir.parent.mkdir()
            claim_data_dir(data_dir, reset=False)
            try:  # what a box's stop and its TemporaryDirectory do
                (data_dir / LOCK_FILE).unlink()
                shutil.rmtree(data_dir.parent)
            except FileNotFoundError as err:
                lost.append(f"box {number} was swept while it ran: {err}")

    churn = threading.Thread(target=boxes_coming_and_going)
    churn.start()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not lost:
            assert sweep_killed_boxes(tmp_path) == []
    finally:
        stop.set()
        churn.join()
    assert lost == []


def test_a_data_dir_in_use_by_a_live_box_is_refused_and_that_box_is_left_alone(tmp_path: Path) -> None:
    data_dir = tmp_path / "box"
    data_dir.mkdir()
    live = subprocess.Popen(["sleep", "60"])
    try:
        (data_dir / LOCK_FILE).write_text(lock_line(live.pid))
        with pytest.raises(BoxError, match=rf"in use by a running box \(pid {live.pid}\)"):
            claim_data_dir(data_dir, reset=True)
        assert live.poll() is None, "the box never kills a process it did not start"
    finally:
        live.kill()
        live.wait()


@pytest.mark.cluster
def test_a_component_that_dies_at_startup_is_named_with_its_log_tail(tmp_path: Path) -> None:
    toolchain.ensure(toolchain.kubernetes_build())
    plane = ControlPlane(
        data_dir=tmp_path / "box", extra_args={"kube-apiserver": ["--service-cluster-ip-range=not-a-cidr"]}
    )
    with pytest.raises(BoxError) as failure:
        plane.start()
    message = str(failure.value)
    assert message.startswith("kube-apiserver exited with code")
    assert "is not a valid cidr" in message, "the log tail shows the cause"
    assert all(not c.alive() for c in plane.components), "etcd, started first, was stopped too"


@pytest.fixture
def box_data_dir() -> Iterator[Path]:
    # Short: kubelet's sockets under the data directory must fit a unix socket address (107 bytes). Laid out
    # as a box's temp dir (``ddpjob-box-*/box``) under a root of its own, for sweep_killed_boxes.
    root = Path(tempfile.mkdtemp(prefix="ddpj-"))
    data_dir = root / "ddpjob-box-t" / "box"
    yield data_dir
    for pid in _processes_mentioning(str(data_dir)):  # only ours: their command lines name our temp dir
        os.kill(pid, signal.SIGKILL)
    if data_dir.exists():
        claim_data_dir(data_dir, reset=True)  # a killed box's node: its pods, shims, bridge, cgroups and chains
    shutil.rmtree(root)


class Output:
    """The rest of a process's output, read on a thread so that the pipe never fills and blocks it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)


OUTPUT: dict[int, Output] = {}
COLD_NODE_SECONDS = 900


def _wait_or_explain(proc: subprocess.Popen[str], data_dir: Path, timeout: float) -> int:
    """Wait for ``cluster up`` to exit; if it does not, fail with its threads' stacks (SIGUSR1) and output."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        proc.wait()
        log = data_dir / "logs" / "kubelet-box-node.log"
        node_log = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        output = "".join(OUTPUT[proc.pid].lines)[-12000:] if proc.pid in OUTPUT else ""
        pytest.fail(f"cluster up did not exit within {timeout:.0f}s; its output and stacks:\n{output}\n"
                    f"--- kubelet log:\n{node_log}")  # fmt: skip


def _start_cluster_up(data_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpjob_box.cli", "up", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_box_env(),
    )
    assert proc.stdout is not None
    # The first node a fresh machine starts imports the images into its containerd store (minutes, once).
    deadline = time.monotonic() + COLD_NODE_SECONDS
    seen: list[str] = []
    for line in proc.stdout:
        if line.startswith("export KUBECONFIG="):
            assert line.strip() == f"export KUBECONFIG={data_dir / 'kubeconfig'}"
            OUTPUT[proc.pid] = Output(proc)
            return proc
        seen.append(line)
        assert time.monotonic() < deadline, "cluster up did not become ready; its output:\n" + "".join(seen)
    pytest.fail(f"cluster up exited with {proc.wait()} before printing the KUBECONFIG line; its output:\n"
                + "".join(seen)[-12000:] + _log_tails(data_dir))  # fmt: skip


def _log_tails(data_dir: Path, lines: int = 30) -> str:
    """The last lines of every log the box wrote under ``data_dir``: what a failed start left to read."""
    return "".join(
        f"\n--- {log.relative_to(data_dir)}:\n{tail(log, lines)}" for log in sorted(data_dir.glob("*/*.log"))
    )


def _wait_gone(data_dir: Path, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _processes_mentioning(str(data_dir))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _run_a_pod(data_dir: Path) -> int:
    """Start a sleeping pod on the node of the box at ``data_dir``; return its host process id once it runs.
    Its command line names ``data_dir``, so it counts among the box's processes."""
    from kubernetes import client, config

    with config.new_client_from_config(config_file=str(data_dir / "kubeconfig")) as api:
        client.CoreV1Api(api).create_namespaced_pod(
            "default",
            {
                "metadata": {"name": "sleeper"},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": images.image_name("trainer"),
                            "command": ["python", "-c", f"import time; time.sleep(600)  # {data_dir}"],
                        }
                    ]
                },
            },
        )
    deadline = time.monotonic() + 120
    while not (pids := [p for p in _processes_mentioning(f"# {data_dir}") if _comm(p) == "python"]):
        assert time.monotonic() < deadline, "the pod did not start"
        time.sleep(0.2)
    return pids[0]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.cluster
@pytest.mark.kubelet  # ``cluster up`` starts a node
@pytest.mark.timeout(COLD_NODE_SECONDS + 300)
def test_ctrl_c_on_cluster_up_leaves_no_process_behind_not_even_a_pods(box_data_dir: Path) -> None:
    proc = _start_cluster_up(box_data_dir)
    assert len(_processes_mentioning(str(box_data_dir))) >= 5
    pod_pid = _run_a_pod(box_data_dir)
    proc.send_signal(signal.SIGINT)
    assert _wait_or_explain(proc, box_data_dir, 120) == 0  # about 15 s alone
    assert _wait_gone(box_data_dir, 10) == []
    assert exited(pod_pid), "the pod's process went with the box"


@pytest.mark.cluster
@pytest.mark.kubelet  # ``cluster up`` starts a node
@pytest.mark.timeout(COLD_NODE_SECONDS + 300)
def test_killing_cluster_up_outright_still_takes_its_components_down(box_data_dir: Path) -> None:
    proc = _start_cluster_up(box_data_dir)
    pod_pid = _run_a_pod(box_data_dir)
    proc.kill()
    proc.wait()
    # PR_SET_PDEATHSIG stops the children of a killed box; the pod lives on under its containerd shim (by
    # design: a kubelet restart must not kill pods), until --reset, or the next box's start, undoes the node
    # the box recorded (tests/box/test_kubelet_node_recovery.py compares the host before and after --reset).
    assert _wait_gone(box_data_dir, 10) == [pod_pid], "only the pod outlives the killed box"
    assert (box_data_dir / "kubenode" / RECORD).exists(), "the node recorded what to clean up after a kill"
    temp = box_data_dir.parent
    assert sweep_killed_boxes(temp.parent) == [temp], "what the next box to start does"
    assert exited(pod_pid), "the sweep kills a killed box's pods"
    assert _wait_gone(box_data_dir, 10) == []
    assert not temp.exists()
