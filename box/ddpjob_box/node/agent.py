"""The node agent: registers a Node, keeps its lease fresh, and runs the pods bound to it.

It is a small kubelet. Each pass lists the pods bound to this node and moves
each one a step towards what its spec and deletion state ask for; every fact
it needs across its own restarts lives in the pod's state directory, so a
restarted agent carries on with the processes that are already running.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from ddpjob_box.kubenode.apiproxy import pump
from ddpjob_box.node import podspec, provisioner, volumes
from ddpjob_box.node.images import ImageRefused
from ddpjob_box.node.launch import Mount, launch_argv
from ddpjob_box.node.network import Bridge, PodNetwork
from ddpjob_box.node.shim import process_start_time, same_process_alive, write_atomic
from ddpjob_box.node.targets import write_targets
from ddpjob_box.toolchain import REPO_ROOT

LEASE_SECONDS = 40
KUBECONFIG_FILE = "kubeconfig"  # written beside a pod's ServiceAccount token
HEARTBEAT_SECONDS = 10
PASS_SECONDS = 0.5
RESTART_BACKOFF = 5.0


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class NodeSettings:
    name: str
    state_dir: Path
    bridge: Bridge
    netns_prefix: str
    owner_pid: int
    owner_start: str
    apiserver_port: int
    bin_dir: Path  # this checkout's environment: python, ddpjob, torchrun
    ca_file: Path


@dataclass
class ContainerState:
    name: str
    dir: Path
    restarts: int = 0

    def pid(self) -> tuple[int, str, float] | None:
        try:
            pid, start, at = (self.dir / "pid").read_text().split()
        except (FileNotFoundError, ValueError):
            return None
        return int(pid), start, float(at)

    def exit(self) -> tuple[int, float] | None:
        try:
            code, at = (self.dir / "exit").read_text().split()
        except (FileNotFoundError, ValueError):
            return None
        return int(code), float(at)

    def spawned(self) -> bool:
        return (self.dir / "spawned").exists()

    def argv(self) -> list[str]:
        return list(json.loads((self.dir / "argv.json").read_text()))

    def running(self) -> bool:
        found = self.pid()
        return found is not None and self.exit() is None and same_process_alive(found[0], found[1])

    def signal(self, sig: int) -> None:
        found = self.pid()
        if found and self.exit() is None and same_process_alive(found[0], found[1]):
            try:
                os.killpg(found[0], sig)
            except ProcessLookupError:
                pass


@dataclass
class PodRecord:
    """What the node remembers about one pod, persisted in ``<state>/pods/<uid>/meta.json``."""

    uid: str
    namespace: str
    name: str
    key: str
    address: str
    dir: Path
    mount_targets: list[str] = field(default_factory=list)
    started_at: float = 0.0
    terminating_since: float = 0.0
    stopped: bool = False
    refused: str = ""

    def save(self) -> None:
        data = {k: v for k, v in self.__dict__.items() if k != "dir"}
        write_atomic(self.dir / "meta.json", json.dumps(data))

    @classmethod
    def load(cls, directory: Path) -> PodRecord:
        data = json.loads((directory / "meta.json").read_text())
        return cls(dir=directory, **data)

    def containers(self) -> list[ContainerState]:
        """The app containers, from their directories ``c-<name>``."""
        return [_container_state(sub, sub.name[2:]) for sub in sorted(self.dir.glob("c-*"))]

    def init_containers(self) -> list[ContainerState]:
        """The init containers in order, from their directories ``i<index>-<name>``."""
        subs = sorted(self.dir.glob("i*-*"), key=lambda p: int(p.name[1:].split("-", 1)[0]))
        return [_container_state(sub, sub.name.split("-", 1)[1]) for sub in subs]

    def all_containers(self) -> list[ContainerState]:
        return [*self.init_containers(), *self.containers()]


def _container_state(directory: Path, name: str) -> ContainerState:
    restarts = directory / "restarts"
    return ContainerState(name, directory, int(restarts.read_text()) if restarts.exists() else 0)


class Agent:
    def __init__(self, settings: NodeSettings, api: client.ApiClient):
        self.s = settings
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.records: dict[str, PodRecord] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # the latest listing, by uid
        self.sent: dict[str, dict[str, Any]] = {}  # the last status patched, by uid
        self.mountpoints = volumes.MountPoints(settings.state_dir / "mountpoints.json")
        # What a pod's volumes must never hide: this checkout (sources and virtualenv) and the Python under it.
        roots = sorted({str(REPO_ROOT), str(settings.bin_dir.parent), sys.base_prefix}, key=len)
        self.keep = [r for i, r in enumerate(roots) if not any(r.startswith(o.rstrip("/") + "/") for o in roots[:i])]
        self.pods_dir = settings.state_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.stop_event = threading.Event()

    # -- node registration ---------------------------------------------------------------
    def node_status(self) -> dict[str, Any]:
        cpus = os.cpu_count() or 1
        memory_kib = int(Path("/proc/meminfo").read_text().split()[1])
        capacity = {"cpu": str(cpus), "memory": f"{memory_kib}Ki", "pods": "110", "ephemeral-storage": "50Gi"}
        heartbeat = now()
        conditions = [
            {
                "type": t,
                "status": "False",
                "reason": f"KubeletHas{r}",
                "message": m,
                "lastHeartbeatTime": heartbeat,
                "lastTransitionTime": heartbeat,
            }
            for t, r, m in (
                ("MemoryPressure", "SufficientMemory", "enough memory"),
                ("DiskPressure", "NoDiskPressure", "enough disk"),
                ("PIDPressure", "SufficientPID", "enough PIDs"),
            )
        ]
        conditions.append(
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "the ddpjob local node is running pods",
                "lastHeartbeatTime": heartbeat,
                "lastTransitionTime": heartbeat,
            }
        )
        return {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": self.s.bridge.gateway},
                {"type": "Hostname", "address": self.s.name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.34.4",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "ddpjob-local://0.1",
                "osImage": "ddpjob local node",
                "kernelVersion": os.uname().release,
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        }

    def register(self) -> None:
        body = {
            "metadata": {
                "name": self.s.name,
                "labels": {
                    "kubernetes.io/hostname": self.s.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "ddpjob.dev/local-node": "true",
                },
            },
            "spec": {},
        }
        try:
            self.core.create_node(body)
        except ApiException as err:
            if err.status != 409:
                raise
        self.core.patch_node_status(self.s.name, {"status": self.node_status()})
        self.renew_lease()

    def renew_lease(self) -> None:
        spec = {
            "holderIdentity": self.s.name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": micro_now(),
        }
        try:
            self.coordination.patch_namespaced_lease(self.s.name, "kube-node-lease", {"spec": spec})
        except ApiException as err:
            if err.status != 404:
                raise
            self.coordination.create_namespaced_lease(
                "kube-node-lease", {"metadata": {"name": self.s.name}, "spec": spec}
            )

    def heartbeat_loop(self) -> None:
        while not self.stop_event.wait(HEARTBEAT_SECONDS):
            try:
                self.renew_lease()
                self.core.patch_node_status(self.s.name, {"status": self.node_status()})
            except Exception as err:
                print(f"node: heartbeat failed: {err}", file=sys.stderr, flush=True)

    # -- pods ---------------------------------------------------------------------------------
    def adopt(self) -> None:
        for directory in self.pods_dir.iterdir():
            if (directory / "meta.json").exists():
                record = PodRecord.load(directory)
                self.records[record.uid] = record

    def allocate_address(self) -> str:
        used = {r.address for r in self.records.values()} | {self.s.bridge.gateway}
        for host in self.s.bridge.subnet.hosts():
            if str(host) not in used:
                return str(host)
        raise RuntimeError("no free pod address left on the bridge")

    def run_pass(self) -> None:
        provisioner.provision(self.core, self.s.state_dir / "claims")
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.s.name}")
        raw = {p.metadata.uid: self.core.api_client.sanitize_for_serialization(p) for p in pods.items}
        self.pods = raw
        new = [
            uid
            for uid, pod in raw.items()
            if uid not in self.records and not _terminal(pod) and not pod["metadata"].get("deletionTimestamp")
        ]
        for uid in new:
            self.admit(raw[uid])
        for uid, pod in raw.items():
            if uid in self.records:
                self.sync(pod, self.records[uid])
            elif pod["metadata"].get("deletionTimestamp"):
                self.finalize_delete(pod)
        for uid in [u for u in self.records if u not in raw]:
            self.forget(self.records[uid])  # force-deleted, or deleted while the agent was down
        self.write_hosts()
        write_targets(
            self.s.state_dir / "targets.json",
            [raw[u] for u in self.records if u in raw and self.records[u].started_at and not self.records[u].stopped],
        )

    def admit(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = meta["uid"].replace("-", "")[:10]
        record = PodRecord(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            key=key,
            address=self.allocate_address(),
            dir=self.pods_dir / meta["uid"],
        )
        record.dir.mkdir(parents=True, exist_ok=True)
        record.save()
        self.records[record.uid] = record

    def network(self, record: PodRecord) -> PodNetwork:
        return PodNetwork(self.s.netns_prefix, record.key, record.address, self.s.bridge)

    def write_hosts(self) -> None:
        """Every pod's hosts file names the pods of its namespace that sit behind a headless Service."""
        raw = self.pods
        by_ns: dict[str, list[tuple[str, list[str]]]] = {}
        services: dict[str, set[str]] = {}
        for uid, record in self.records.items():
            pod = raw.get(uid)
            if pod is None:
                continue
            ns = record.namespace
            if ns not in services:
                services[ns] = {s.metadata.name for s in self.core.list_namespaced_service(ns).items}
            subdomain = pod["spec"].get("subdomain")
            if subdomain and subdomain in services[ns]:
                by_ns.setdefault(ns, []).append((record.address, podspec.dns_names(pod)))
        for uid, record in self.records.items():
            pod = raw.get(uid)
            if pod is None or record.stopped:
                continue
            net = self.network(record)
            if not net.etc_dir.exists():
                continue
            own = (record.address, podspec.own_names(pod))
            peers = [e for e in by_ns.get(record.namespace, []) if e[0] != record.address]
            api = (
                self.s.bridge.gateway,
                [
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
            )
            net.write_hosts([own, *peers, api])

    def lookup(self, namespace: str) -> podspec.ConfigLookup:
        def get(kind: str, name: str) -> Mapping[str, str] | None:
            try:
                if kind == "configMap":
                    return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
                return volumes.decode_secret(self.core.read_namespaced_secret(name, namespace).data)
            except ApiException as err:
                if err.status == 404:
                    return None
                raise

        return get

    def mint_token(
        self, namespace: str, service_account: str, audiences: list[str], seconds: int, pod: Mapping[str, Any]
    ) -> str:
        spec: dict[str, Any] = {
            "expirationSeconds": max(seconds, 600),
            "boundObjectRef": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        }
        if audiences:
            spec["audiences"] = audiences
        result = self.core.create_namespaced_service_account_token(service_account, namespace, {"spec": spec})
        return str(result.status.token)

    def claim_path(self, namespace: str, claim: str) -> Path:
        pvc = self.core.read_namespaced_persistent_volume_claim(claim, namespace)
        if not pvc.spec.volume_name:
            raise volumes.VolumeNotReady(f"claim {claim} is not bound yet")
        pv = self.core.read_persistent_volume(pvc.spec.volume_name)
        if pv.spec.host_path is None:
            raise volumes.VolumeNotReady(f"volume {pv.metadata.name} is not a hostPath volume")
        path = Path(pv.spec.host_path.path)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start(self, pod: dict[str, Any], record: PodRecord) -> None:
        """Prepare everything a pod needs (image check, volumes, network, each container's command); spawn nothing."""
        spec = pod["spec"]
        lookup = self.lookup(record.namespace)
        pod = {
            **pod,
            "status": {**pod.get("status", {}), "podIP": record.address, "hostIP": self.s.bridge.gateway},
        }
        inits, mains = spec.get("initContainers") or [], spec["containers"]
        resolved = [podspec.process(pod, c, lookup, os.cpu_count() or 1) for c in [*inits, *mains]]
        refused = [r for r in resolved if isinstance(r, ImageRefused)]
        if refused:
            record.refused = refused[0].message
            record.save()
            self.patch_status(pod, record, waiting=(refused[0].reason, refused[0].message))
            return
        self.patch_status(pod, record, waiting=("ContainerCreating", ""))
        try:
            paths = volumes.prepare(
                pod, record.dir, lookup=lookup, mint_token=self.mint_token, claim_path=self.claim_path
            )
        except volumes.VolumeNotReady as err:
            self.patch_status(pod, record, waiting=("ContainerCreating", str(err)))
            return
        token_volume = self.write_kubeconfig(pod, paths)
        hostname = spec.get("hostname") or record.name
        net = self.network(record)
        net.create(hostname)
        self.write_hosts()  # before any process starts, so its first lookups already resolve
        dirs = [f"i{index}-{c['name']}" for index, c in enumerate(inits)] + [f"c-{c['name']}" for c in mains]
        for container, proc, dirname in zip([*inits, *mains], resolved, dirs, strict=True):
            assert not isinstance(proc, ImageRefused)
            mounts = []
            for m in container.get("volumeMounts", []):
                source = paths[m["name"]]
                if m.get("subPath"):
                    source = source / m["subPath"]
                    source.mkdir(parents=True, exist_ok=True)
                # Recorded before any directory is made: a mount point in use is never swept.
                record.mount_targets.append(m["mountPath"])
                record.save()
                self.mountpoints.make(Path(m["mountPath"]))
                mounts.append(Mount(str(source), m["mountPath"], bool(m.get("readOnly"))))
            cdir = record.dir / dirname
            cdir.mkdir(exist_ok=True)
            env = self.container_env(proc.env, record)
            token_mount = next(
                (m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] == token_volume), None
            )
            if token_mount is not None:
                env.setdefault("KUBECONFIG", f"{token_mount}/{KUBECONFIG_FILE}")
            write_atomic(cdir / "env.json", json.dumps(env))
            write_atomic(
                cdir / "argv.json",
                json.dumps(launch_argv(net.netns, hostname, mounts, proc.working_dir, proc.argv, self.keep)),
            )
        record.started_at = time.time()
        record.save()

    def write_kubeconfig(self, pod: Mapping[str, Any], paths: Mapping[str, Path]) -> str | None:
        """Put a kubeconfig for the pod's ServiceAccount token into that token's volume; return the volume's name.

        It is self-contained (token and CA inline), so it works wherever the volume is mounted,
        for programs that read KUBECONFIG rather than the in-cluster files.
        """
        for volume in pod["spec"].get("volumes") or []:
            sources = (volume.get("projected") or {}).get("sources") or []
            token = next((s["serviceAccountToken"]["path"] for s in sources if "serviceAccountToken" in s), None)
            if token is None:
                continue
            directory = paths[volume["name"]]
            server = f"https://{self.s.bridge.gateway}:{self.s.apiserver_port}"
            ca = base64.b64encode(self.s.ca_file.read_bytes()).decode()
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "pod",
                "clusters": [{"name": "box", "cluster": {"server": server, "certificate-authority-data": ca}}],
                "users": [{"name": "sa", "user": {"token": (directory / token).read_text()}}],
                "contexts": [
                    {
                        "name": "pod",
                        "context": {"cluster": "box", "user": "sa", "namespace": pod["metadata"]["namespace"]},
                    }
                ],
            }
            write_atomic(directory / KUBECONFIG_FILE, json.dumps(config))
            return str(volume["name"])
        return None

    def container_env(self, env: dict[str, str], record: PodRecord) -> dict[str, str]:
        base = {
            "PATH": f"{self.s.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(record.dir / "home"),
            "KUBERNETES_SERVICE_HOST": self.s.bridge.gateway,
            "KUBERNETES_SERVICE_PORT": str(self.s.apiserver_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.s.apiserver_port),
        }
        (record.dir / "home").mkdir(exist_ok=True)
        return {**base, **env}

    def spawn(self, c: ContainerState) -> None:
        for stale in ("pid", "exit"):
            (c.dir / stale).unlink(missing_ok=True)
        shim = [sys.executable, "-m", "ddpjob_box.node.shim", "--dir", str(c.dir)]
        owner = ["--owner-pid", str(self.s.owner_pid), "--owner-start", self.s.owner_start]
        (c.dir / "spawned").touch()
        with open(c.dir / "shim.log", "ab") as log:
            subprocess.Popen(
                [*shim, *owner, "--", *c.argv()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )

    def respawn_if_due(self, c: ContainerState, policy: str) -> bool:
        """Restart an exited container when the pod's restartPolicy asks for it; True if it will run again."""
        exited = c.exit()
        if exited is None:
            return True
        if not (policy == "Always" or (policy == "OnFailure" and exited[0] != 0)):
            return False
        if time.time() - exited[1] >= RESTART_BACKOFF:
            c.restarts += 1
            write_atomic(c.dir / "restarts", str(c.restarts))
            self.spawn(c)
        return True

    def sync(self, pod: dict[str, Any], record: PodRecord) -> None:
        if pod["metadata"].get("deletionTimestamp"):
            self.terminate(pod, record)
            return
        if record.refused or record.stopped:
            return
        if not record.started_at:
            self.start(pod, record)
            if not record.started_at:
                return
        policy = pod["spec"].get("restartPolicy", "Always")
        # Init containers run one at a time, in order; the app containers start once all have succeeded.
        for init in record.init_containers():
            if not init.spawned():
                self.spawn(init)
            exited = init.exit()
            if exited is None or exited[0] != 0:
                if exited is not None and not self.respawn_if_due(init, policy):
                    self.patch_status(pod, record)
                    self.release(record)
                    return
                self.patch_status(pod, record)
                return
        containers = record.containers()
        for c in containers:
            if not c.spawned():
                self.spawn(c)
        again = [self.respawn_if_due(c, policy) for c in containers]
        self.patch_status(pod, record)
        if not any(again):
            self.release(record)

    def terminate(self, pod: dict[str, Any], record: PodRecord) -> None:
        containers = record.all_containers()
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        grace = 30 if grace is None else int(grace)
        if not record.terminating_since:
            record.terminating_since = time.time()
            record.save()
            for c in containers:
                c.signal(signal.SIGTERM)
        elif time.time() - record.terminating_since >= grace:
            for c in containers:
                c.signal(signal.SIGKILL)
        if any(c.running() for c in containers):
            return
        if record.started_at and not record.stopped:
            self.patch_status(pod, record)
        self.forget(record)
        self.finalize_delete(pod)

    def finalize_delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            # With a body, the apiserver ignores query parameters: the grace period goes in the body too.
            options = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=options)
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def release(self, record: PodRecord) -> None:
        """The pod's processes are done: free its network and mount points, keep its record."""
        self.network(record).delete()
        record.stopped = True
        record.save()
        self.sweep_mountpoints()

    def forget(self, record: PodRecord) -> None:
        for c in record.all_containers():
            c.signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(c.running() for c in record.all_containers()) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.network(record).delete()
        shutil.rmtree(record.dir, ignore_errors=True)
        self.records.pop(record.uid, None)
        self.sent.pop(record.uid, None)
        self.sweep_mountpoints()

    def sweep_mountpoints(self) -> None:
        in_use = [t for r in self.records.values() if not r.stopped for t in r.mount_targets]
        self.mountpoints.sweep(in_use)

    def patch_status(self, pod: dict[str, Any], record: PodRecord, waiting: tuple[str, str] | None = None) -> None:
        body = pod_status(pod, record, self.s.bridge.gateway, waiting)
        # The last status this agent sent: the API echoes timestamps in another format, so comparing
        # against it would patch every pass, and every patch wakes the operator.
        if self.sent.get(record.uid) == body:
            return
        try:
            self.core.patch_namespaced_pod_status(record.name, record.namespace, {"status": body})
        except ApiException as err:
            if err.status != 404:
                raise
        self.sent[record.uid] = body

    def loop(self) -> None:
        threading.Thread(target=self.heartbeat_loop, daemon=True).start()
        while not self.stop_event.is_set():
            try:
                self.run_pass()
            except Exception as err:
                print(f"node: pass failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            self.stop_event.wait(PASS_SECONDS)


def _terminal(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def container_status(spec: Mapping[str, Any], c: ContainerState | None, waiting: tuple[str, str]) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": spec["name"],
        "image": spec.get("image", ""),
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": c.restarts if c else 0,
    }
    pid = c.pid() if c and c.spawned() else None
    exited = c.exit() if c else None
    if pid is None:
        reason, message = waiting
        status["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    elif exited is None:
        status.update(ready=True, started=True)
        status["state"] = {"running": {"startedAt": stamp(pid[2])}}
    else:
        code = exited[0]
        status["state"] = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": stamp(pid[2]),
                "finishedAt": stamp(exited[1]),
            }
        }
    return status


def pod_status(
    pod: Mapping[str, Any], record: PodRecord, host_ip: str, waiting: tuple[str, str] | None
) -> dict[str, Any]:
    """The status a kubelet would report, computed from the container files."""
    policy = pod["spec"].get("restartPolicy", "Always")
    creating = waiting or ("ContainerCreating", "")
    inits = {c.name: c for c in record.init_containers()}
    init_statuses = [
        container_status(spec, inits.get(spec["name"]), creating) for spec in pod["spec"].get("initContainers") or []
    ]
    init_codes = [s["state"]["terminated"]["exitCode"] for s in init_statuses if "terminated" in s["state"]]
    initialized = len(init_codes) == len(init_statuses) and all(code == 0 for code in init_codes)
    init_failed = policy == "Never" and any(code != 0 for code in init_codes)
    mains = {c.name: c for c in record.containers()}
    app_waiting = creating if initialized or waiting else ("PodInitializing", "")
    statuses = [container_status(spec, mains.get(spec["name"]), app_waiting) for spec in pod["spec"]["containers"]]
    terminated = [s["state"]["terminated"] for s in statuses if "terminated" in s["state"]]
    all_done = len(terminated) == len(statuses)
    if init_failed:
        phase = "Failed"
    elif all_done and (policy == "Never" or (policy == "OnFailure" and all(t["exitCode"] == 0 for t in terminated))):
        phase = "Succeeded" if all(t["exitCode"] == 0 for t in terminated) else "Failed"
    elif any(s["started"] for s in statuses) or (terminated and policy != "Never"):
        phase = "Running"
    else:
        phase = "Pending"
    ready = all(s["ready"] for s in statuses)
    body: dict[str, Any] = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True" if record.started_at else "False"},
            {
                "type": "Initialized",
                "status": "True" if initialized else "False",
                **({} if initialized else {"reason": "ContainersNotInitialized"}),
            },
            {"type": "ContainersReady", "status": "True" if ready else "False"},
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                **({} if ready else {"reason": "PodCompleted" if all_done else "ContainersNotReady"}),
            },
        ],
        "containerStatuses": statuses,
    }
    if init_statuses:
        body["initContainerStatuses"] = init_statuses
    if record.started_at:
        body.update(podIP=record.address, podIPs=[{"ip": record.address}], startTime=stamp(record.started_at))
    return body


def main(argv: list[str] | None = None) -> int:
    import argparse
    import ipaddress

    parser = argparse.ArgumentParser(prog="ddpjob_box.node.agent")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--name", default="box-node")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--bridge", required=True)
    parser.add_argument("--subnet", required=True)
    parser.add_argument("--netns-prefix", required=True)
    parser.add_argument("--owner-pid", type=int, required=True)
    parser.add_argument("--apiserver-port", type=int, required=True)
    parser.add_argument("--ca-file", type=Path, required=True)
    args = parser.parse_args(argv)
    settings = NodeSettings(
        name=args.name,
        state_dir=args.state_dir,
        bridge=Bridge(args.bridge, ipaddress.IPv4Network(args.subnet)),
        netns_prefix=args.netns_prefix,
        owner_pid=args.owner_pid,
        owner_start=process_start_time(args.owner_pid),
        apiserver_port=args.apiserver_port,
        bin_dir=Path(sys.executable).parent,
        ca_file=args.ca_file,
    )
    settings.bridge.create()
    agent = Agent(settings, config.new_client_from_config(config_file=args.kubeconfig))
    # Pods reach the apiserver at KUBERNETES_SERVICE_HOST:PORT, and at kubernetes.default.svc:443 as some
    # clients assume (Kopf's in-cluster login does).
    for listen in (args.apiserver_port, 443):
        threading.Thread(
            target=serve_apiserver_proxy, args=(settings.bridge.gateway, listen, args.apiserver_port), daemon=True
        ).start()
    agent.adopt()
    agent.register()
    signal.signal(signal.SIGTERM, lambda *_: agent.stop_event.set())
    print(f"node {settings.name} ready on {settings.bridge.name} {settings.bridge.subnet}", flush=True)
    agent.loop()
    return 0


def serve_apiserver_proxy(host: str, listen: int, port: int) -> None:
    """Forward <bridge gateway>:<listen> to the apiserver on loopback <port>, for pods in their namespaces."""
    listener = socket.create_server((host, listen))
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_pipe_pair, args=(conn, port), daemon=True).start()


def _pipe_pair(conn: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port))
    except OSError:
        conn.close()
        return

    threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()
    pump(conn, upstream)
    conn.close()
    upstream.close()


if __name__ == "__main__":
    sys.exit(main())
