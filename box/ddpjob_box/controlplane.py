"""Start and stop a real control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

Everything listens on 127.0.0.1 on free ports. The apiserver serves TLS with a
box CA, authenticates with static tokens, authorizes with RBAC and signs
service-account tokens. Each component keeps its log under ``<data-dir>/logs``.
Once all are up, one that exits on its own is started again, as kubelet restarts
a static pod; each such restart is said on stderr and kept in ``restarted``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ddpjob_box import audit, toolchain
from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode.leftovers import RECORD, recover
from ddpjob_box.pki import make_pki
from ddpjob_box.ports import free_port, require_free
from ddpjob_box.processes import Component, Supervisor, exited, tail, wait_until
from ddpjob_contract.pods import POD_GROUP_API

LOCK_FILE = "box.pid"
# The temporary directories that the tests, the benchmarks and `python -m ddpjob_box` make for a box; a
# killed one is swept when the next box starts (sweep_killed_boxes).
TEMP_PREFIXES = ("ddpjob-box-", "ddpjob-chaos-", "ddpjob-gang-", "ddpjob-bench-")
SERVICE_CIDR = "10.0.0.0/24"


def _process_start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def lock_line(pid: int) -> str:
    """What a data directory's lock holds for process ``pid``: its pid and start time (a reused pid differs)."""
    return f"{pid} {_process_start_time(pid)}\n"


def _lock_owner(lock: Path) -> tuple[int, bool]:
    """The pid in a data directory's lock, and whether that process still runs (the same one: its start time)."""
    owner = lock.read_text().split()
    pid = int(owner[0]) if owner and owner[0].isdigit() else -1
    started = owner[1] if len(owner) > 1 else ""
    return pid, pid > 0 and not exited(pid) and _process_start_time(pid) == started


def _undo(data_dir: Path) -> None:
    """Put back what the nodes of a killed box changed on the host, then remove its data directory."""
    for record in data_dir.glob(f"*/{RECORD}"):
        recover(record.parent)  # a killed node's pods, shims, mounts, cgroups, bridge and chains
    shutil.rmtree(data_dir)


def sweep_killed_boxes(root: Path, prefixes: tuple[str, ...] = TEMP_PREFIXES) -> list[Path]:
    """Undo the temporary boxes under ``root`` whose process was killed outright (a SIGKILL of the whole
    session, which no ``finally`` sees): their nodes' host state and their directories. A box still
    running, or one not yet holding its lock, is left alone. Returns the directories removed."""
    swept = []
    for lock in _box_locks(root, prefixes):
        temp = lock.parent.parent
        try:
            pid, alive = _lock_owner(lock)
        except FileNotFoundError:
            continue  # its box stopped since the listing
        if alive or pid < 0:  # running, or a lock not written whole (claim_data_dir writes it in one rename)
            continue
        try:
            _undo(lock.parent)
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            print(f"box: could not undo the killed box in {temp} (pid {pid}): {err}; remove it by hand",
                  file=sys.stderr)  # fmt: skip
            continue
        shutil.rmtree(temp, ignore_errors=True)
        print(f"box: removed what a killed box (pid {pid}) left: {temp} and its node's host state", file=sys.stderr)
        swept.append(temp)
    return swept


def _box_locks(root: Path, prefixes: tuple[str, ...]) -> list[Path]:
    """The locks of the boxes in the temporary directories under ``root``. Not ``Path.glob``: it raises when a
    directory it walks is removed meanwhile, and other boxes on the host remove theirs at any time."""
    locks = []
    with contextlib.suppress(OSError):
        for temp in sorted(root.iterdir()):
            if temp.name.startswith(prefixes):
                with contextlib.suppress(OSError):  # removed meanwhile, or not a directory
                    locks += [child / LOCK_FILE for child in sorted(temp.iterdir()) if (child / LOCK_FILE).exists()]
    return locks


def claim_data_dir(data_dir: Path, *, reset: bool) -> None:
    """Take the data directory for this process, refusing one in use and explaining a stale one."""
    lock = data_dir / LOCK_FILE
    if lock.exists():
        pid, alive = _lock_owner(lock)
        if alive and pid != os.getpid():
            raise BoxError(
                f"data directory {data_dir} is in use by a running box (pid {pid}): stop that box "
                "(Ctrl-C in its terminal) or choose another --data-dir"
            )
        if not reset:
            raise BoxError(
                f"data directory {data_dir} was left by a run that was killed (pid {pid} is gone): "
                "pass --reset to wipe it, or choose another --data-dir"
            )
    elif data_dir.exists() and any(data_dir.iterdir()) and not reset:
        raise BoxError(
            f"data directory {data_dir} is not empty and was not made by a box: pass --reset to wipe it, "
            "or choose another --data-dir"
        )
    if data_dir.exists():
        _undo(data_dir)
    data_dir.mkdir(parents=True)
    # Whole or absent: another box's sweep that read it half-written would take this box for a killed one.
    partial = data_dir / f".{LOCK_FILE}.{os.getpid()}"
    partial.write_text(lock_line(os.getpid()))
    partial.replace(lock)


@dataclass
class ControlPlane:
    """A running control plane. Use as a context manager, or call start() and stop()."""

    data_dir: Path
    apiserver_port: int | None = None
    reset: bool = False
    extra_ips: tuple[str, ...] = ()
    # Extra flags per component name, appended last so they override the defaults.
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    pod_groups: bool = True
    """Serve the PodGroup API and schedule gangs (GenericWorkload); False: a cluster without them."""
    audit_requests: bool = False
    """Audit every request of the clients outside the control plane, not only removals (ddpjob_box.audit)."""
    audit_accounts: tuple[str, ...] = ()
    """Service accounts (``namespace:name``) whose every request is audited too (``audit.policy``)."""
    components: list[Component] = field(default_factory=list)
    admin_token: str = field(default_factory=lambda: os.urandom(16).hex())
    etcd_url: str = ""
    """etcd's client URL (its v3 JSON gateway too), once started."""
    restarted: list[str] = field(default_factory=list)
    """A line for each time a component exited on its own and was started again."""
    supervisor: Supervisor | None = None

    def _gang_flags(self) -> list[str]:
        """The Workload and PodGroup API and gang scheduling (beta in 1.37, off by default)."""
        return [f"--feature-gates=GenericWorkload={str(self.pod_groups).lower()}"]

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def ca_file(self) -> Path:
        return self.data_dir / "pki" / "ca.crt"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def audit_log(self) -> Path:
        """Every removal of a pod, Service or PodGroup the apiserver answered (ddpjob_box.audit)."""
        return audit.log_path(self.logs_dir)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        if self.apiserver_port is not None:
            require_free(self.apiserver_port, "kube-apiserver")
        bins = toolchain.ensure(toolchain.kubernetes_build())
        sweep_killed_boxes(Path(tempfile.gettempdir()))
        claim_data_dir(self.data_dir, reset=self.reset)
        try:
            self._start(bins)
        except BaseException:
            self.stop()
            raise
        self.supervisor = Supervisor(self.components, self.say_restarted)

    def say_restarted(self, line: str) -> None:
        """A component of the box (this plane's, or a node's) exited on its own and was started again."""
        self.restarted.append(line)
        print(f"box: {line}", file=sys.stderr, flush=True)

    def _start(self, bins: dict[str, Path]) -> None:
        pki = self.data_dir / "pki"
        make_pki(
            pki,
            ips=["127.0.0.1", "10.0.0.1", *self.extra_ips],
            dns=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        tokens = {
            "admin": (self.admin_token, "box-admin", "system:masters"),
            "kcm": (os.urandom(16).hex(), "system:kube-controller-manager", ""),
            "scheduler": (os.urandom(16).hex(), "system:kube-scheduler", ""),
        }
        (self.data_dir / "tokens.csv").write_text(
            "".join(f'{tok},{user},{user},"{group}"\n' for tok, user, group in tokens.values())
        )
        self.apiserver_port = self.apiserver_port or free_port()
        for name, (token, _, _) in tokens.items():
            self._write_kubeconfig(self.data_dir / f"{name}.kubeconfig", token)
        shutil.copy(self.data_dir / "admin.kubeconfig", self.kubeconfig)

        etcd_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = self._component(
            "etcd",
            [
                str(bins["etcd"]),
                "--name=box",
                f"--data-dir={self.data_dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=box=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        wait_until(
            "etcd /health",
            lambda: b'"health":"true"' in _get(f"http://127.0.0.1:{etcd_port}/health"),
            60,
            watch=[etcd],
        )

        apiserver = self._component(
            "kube-apiserver",
            [
                str(bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                # Filling the request-header CA keeps the scheduler and controller manager from erroring on it.
                f"--requestheader-client-ca-file={pki / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                # The apiserver's identity when it proxies to an aggregated API (Kueue's visibility API): without
                # it that server sees anonymous requests, refuses discovery, and its APIService stays unavailable.
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                f"--token-auth-file={self.data_dir / 'tokens.csv'}",
                # Node authorizes kubelets (system:node:<name>) for their own node and pods, as in any cluster.
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                # How the apiserver reaches kubelets for logs, exec and port-forward.
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={pki}",
                *audit.apiserver_flags(self.logs_dir, requests=self.audit_requests, accounts=self.audit_accounts),
                *self._gang_flags(),
                f"--runtime-config={POD_GROUP_API}={str(self.pod_groups).lower()}",
            ],
        )
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        readyz = f"{self.server}/readyz"
        wait_until(
            "kube-apiserver /readyz",
            lambda: _get(readyz, ctx, self.admin_token) == b"ok",
            120,
            watch=[etcd, apiserver],
        )

        for name, extra in (
            (
                "kube-controller-manager",
                [
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                    f"--cluster-signing-key-file={pki / 'ca.key'}",
                    "--use-service-account-credentials=true",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                ],
            ),
            ("kube-scheduler", []),
        ):
            short = "kcm" if name == "kube-controller-manager" else "scheduler"
            kubeconfig = self.data_dir / f"{short}.kubeconfig"
            self._component(
                name,
                [
                    str(bins[name]),
                    f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    *self._gang_flags(),
                    *extra,
                ],
            )
        # The serviceaccount controller making default/default proves the controller manager works end to end.
        sa_url = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        wait_until(
            "the default ServiceAccount from kube-controller-manager",
            lambda: b'"name":"default"' in _get(sa_url, ctx, self.admin_token),
            120,
            watch=self.components,
        )

    def _component(self, name: str, argv: list[str]) -> Component:
        argv = [*argv, *self.extra_args.get(name, [])]
        component = Component(name, argv, self.logs_dir / f"{name}.log")
        component.start()
        self.components.append(component)
        return component

    def _write_kubeconfig(self, path: Path, token: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "box",
            "preferences": {},
            "clusters": [
                {
                    "name": "box",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.data_dir / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "box", "user": {"token": token}}],
            "contexts": [{"name": "box", "context": {"cluster": "box", "user": "box", "namespace": "default"}}],
        }
        path.write_text(json.dumps(config, indent=2) + "\n")
        path.chmod(0o600)

    def log_tails(self, lines: int = 25) -> str:
        return "\n".join(f"--- {c.name} ({c.log_path}):\n{tail(c.log_path, lines)}" for c in self.components)

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        for component in reversed(self.components):
            component.stop()
        lock = self.data_dir / LOCK_FILE
        if lock.exists() and lock.read_text().split()[:1] == [str(os.getpid())]:
            lock.unlink()


def _get(url: str, ctx: ssl.SSLContext | None = None, token: str | None = None) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=5) as response:
            return bytes(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return b""


def wait_forever() -> None:
    """Block until the process is interrupted (a component that exits is started again, and said so)."""
    while True:
        time.sleep(1)
