"""Small raw-JSON client and waiting helpers for cluster tests.

Raw JSON (no client models), like the operator: DDPJob specs and pod statuses go through as
written, and the apiserver's own validation messages come back untouched.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import pytest
import yaml
from prometheus_client import generate_latest

from ddp_trainer.metrics import Metrics, StepTiming
from ddpjob_box.controlplane import ControlPlane
from ddpjob_box.errors import BoxError
from ddpjob_contract.pods import ENV_METRICS_PORT, LABEL_JOB_NAME
from ddpjob_operator import api

T = TypeVar("T")

CRD_FILE = Path(__file__).resolve().parents[2] / "helm" / "ddpjob" / "crds" / "ddpjob.yaml"
JOBS = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{{ns}}/{api.PLURAL}"
WAIT = 30.0


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        self.message = body.get("message", "") if isinstance(body, dict) else str(body)
        super().__init__(f"HTTP {status}: {self.message}")


def trainer_metrics(*, joined: bool = True, steps: int = 0, work: float = 0.01, total: int = 0) -> str:
    """What the real trainer's /metrics says after ``steps`` steps of ``work`` seconds each (plus 20 ms of backward),
    in a run of ``total`` steps (0: not known yet)."""
    metrics = Metrics()
    metrics.pg_ready.set(1 if joined else 0)
    metrics.target_step.set(total)
    for n in range(1, steps + 1):
        phases = {"data": 0.0, "forward": work, "backward": 0.02, "optimizer": 0.0}
        metrics.record(StepTiming(step=n, samples=16, step_seconds=work + 0.02, phase_seconds=phases, loss=1.0))
    return generate_latest(metrics.registry).decode()


JOINED = trainer_metrics()
HANG = "<hang>"
"""A trainer that accepts the connection and never answers (SIGSTOPped)."""
Trainer = str | Callable[[], str]
"""What a fake trainer serves: fixed text, HANG, or text made afresh for each request (a trainer that trains)."""


def training(*, work: float = 0.01, steps_per_second: float = 20.0) -> Callable[[], str]:
    """A trainer that does ``steps_per_second`` steps of ``work`` seconds from now on."""
    began = time.monotonic()
    return lambda: trainer_metrics(steps=int((time.monotonic() - began) * steps_per_second), work=work)


class FakeTrainers:
    """Plays the trainer of each Running pod: a /metrics endpoint on a loopback address of the pod's own.

    Every address in 127.0.0.0/8 is local, so each pod gets one (its podIP) and all serve the job's
    metricsPort, as real pods do; the operator polls them by direct HTTP like any pod IP.
    """

    def __init__(self) -> None:
        self._prefix = f"127.{random.randint(1, 254)}"
        self._next = itertools.count()
        self._ips: dict[str, str] = {}
        self._texts: dict[str, Trainer] = {}
        self._servers: list[ThreadingHTTPServer] = []
        self._closed = threading.Event()

    def serve(self, key: str, port: int, text: Trainer) -> str:
        """Serve ``text`` for the pod ``key`` (its uid); returns the pod's IP."""
        self._texts[key] = text
        if key in self._ips:
            return self._ips[key]
        n = next(self._next)
        ip = f"{self._prefix}.{n // 250}.{n % 250 + 1}"
        texts, closed = self._texts, self._closed

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                trainer = texts.get(key, "")
                if trainer == HANG:
                    closed.wait()
                    return
                body = (trainer() if callable(trainer) else trainer).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        server = ThreadingHTTPServer((ip, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._servers.append(server)
        self._ips[key] = ip
        return ip

    def close(self) -> None:
        self._closed.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()
        self._ips.clear()
        self._texts.clear()
        self._closed = threading.Event()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


METRICS_PORT = free_port()
"""The metricsPort of test jobs: free on every address here, so fake trainers can serve it."""


class Raw:
    def __init__(self, api_client: Any) -> None:
        self.api = api_client
        self.trainers = FakeTrainers()

    def request(self, method: str, path: str, body: Any = None, *, query: list[tuple[str, str]] | None = None,
                content_type: str = "application/json", headers_accept: str = "application/json") -> Any:  # fmt: skip
        m, url, h, b, _ = self.api.param_serialize(
            method=method, resource_path=path, query_params=query or [], body=body, auth_settings=["BearerToken"],
            header_params={"Accept": headers_accept, "Content-Type": content_type},
        )  # fmt: skip
        response = self.api.call_api(m, url, header_params=h, body=b, _request_timeout=30)
        raw = response.read()
        ok = 200 <= response.status < 300
        try:
            data = json.loads(raw) if raw else None
        except ValueError:  # a group the apiserver has not registered yet answers "404 page not found" as text
            if ok:
                raise
            data = raw.decode(errors="replace")
        if not ok:
            raise ApiError(response.status, data)
        return data

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def merge(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)

    # DDPJobs

    def create_job(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.post(JOBS.format(ns=ns), body))

    def job(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.get(f"{JOBS.format(ns=ns)}/{name}"))
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def status(self, ns: str, name: str) -> dict[str, Any]:
        job = self.job(ns, name)
        return dict((job or {}).get("status") or {})

    def patch_job(self, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return dict(self.merge(f"{JOBS.format(ns=ns)}/{name}", patch))

    # Pods, services, events

    def pods(self, ns: str, job: str | None = None) -> list[dict[str, Any]]:
        query = [("labelSelector", f"{LABEL_JOB_NAME}={job}")] if job else []
        return list(self.get(f"/api/v1/namespaces/{ns}/pods", query=query)["items"])

    def services(self, ns: str) -> list[dict[str, Any]]:
        return list(self.get(f"/api/v1/namespaces/{ns}/services")["items"])

    def events(self, ns: str, name: str) -> list[dict[str, Any]]:
        query = [("fieldSelector", f"involvedObject.kind={api.KIND},involvedObject.name={name}")]
        return list(self.get(f"/api/v1/namespaces/{ns}/events", query=query)["items"])

    def delete_pod(self, ns: str, name: str) -> None:
        self.delete(f"/api/v1/namespaces/{ns}/pods/{quote(name)}")

    def set_pod(self, ns: str, name: str, phase: str, *, exit_code: int | None = None, reason: str = "",
                container: str = "trainer", trainer: Trainer | None = JOINED) -> None:  # fmt: skip
        """Play the kubelet: report a phase and, optionally, how the trainer container ended.

        A Running pod also gets a trainer answering on its podIP with ``trainer`` (by default, a rank
        that has joined the process group); None: nothing answers there.
        """
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ip = "10.244.0.10"
        if phase == "Running" and exit_code is None and trainer is not None:
            pod = self.get(f"/api/v1/namespaces/{ns}/pods/{quote(name)}")
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            ip = self.trainers.serve(pod["metadata"]["uid"], int(env[ENV_METRICS_PORT]), trainer)
        state: dict[str, Any] = {"running": {"startedAt": now}}
        if exit_code is not None:
            state = {"terminated": {"exitCode": exit_code, "startedAt": now, "finishedAt": now}}
        status: dict[str, Any] = {
            "phase": phase,
            "podIP": ip,
            "containerStatuses": [{
                "name": container, "image": "trainer", "imageID": "", "ready": phase == "Running",
                "restartCount": 0, "state": state,
            }],
        }  # fmt: skip
        if reason:
            status |= {"reason": reason, "containerStatuses": []}
        self.merge(f"/api/v1/namespaces/{ns}/pods/{quote(name)}/status", {"status": status})

    def set_all(self, ns: str, job: str, phase: str, **kw: Any) -> None:
        """Every pod of the job as listed; one the operator deleted since (a gang restart) is no longer its pod."""
        for pod in self.pods(ns, job):
            try:
                self.set_pod(ns, pod["metadata"]["name"], phase, **kw)
            except ApiError as err:
                if err.status != 404:
                    raise


def apply_crd(raw: Raw) -> dict[str, Any]:
    """Install (or update) the CRD from the chart and wait until the apiserver serves it."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    name = crd["metadata"]["name"]
    try:
        existing = raw.get(f"{path}/{name}")
    except ApiError as err:
        if err.status != 404:
            raise
        raw.post(path, crd)
    else:
        crd["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        raw.request("PUT", f"{path}/{name}", crd)

    def established() -> bool:
        conditions = raw.get(f"{path}/{name}").get("status", {}).get("conditions", [])
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, what="the CRD to be established")
    # the storage layer for the new schema may lag Established by a moment
    wait_for(lambda: raw.get(f"/apis/{api.GROUP}/{api.VERSION}") is not None, what="the API group")
    return dict(crd)


@contextmanager
def own_plane(**options: Any) -> Iterator[ControlPlane]:
    """A control plane of a module's own (``ControlPlane`` options), in a temporary directory, stopped after."""
    with tempfile.TemporaryDirectory(prefix="ddpjob-plane-") as tmp:
        plane = ControlPlane(Path(tmp) / "plane", **options)
        try:
            plane.start()
        except BoxError as err:
            pytest.fail(f"the control plane did not start: {err}", pytrace=False)
        try:
            yield plane
        finally:
            plane.stop()


def wait_for(
    check: Callable[[], T], *, timeout: float = WAIT, what: str = "the condition", seen: Callable[[], object] = str
) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what``, the last value, and what ``seen``
    returns then (the state the test waited on, as tests/e2e/kube.wait_for has it)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except (ApiError, KeyError, IndexError, TypeError) as err:
            last = err
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            said = seen()
            raise AssertionError(f"timed out waiting for {what}; last: {last!r}" + (f"\n{said}" if said else ""))
        time.sleep(0.1)


TRAINER = {"name": "trainer", "image": "registry.example/ddp-trainer:1", "command": ["python", "-m", "ddp_trainer"]}


def job_body(name: str = "train", replicas: int = 2, **spec: Any) -> dict[str, Any]:
    template = spec.pop("template", {"spec": {"containers": [copy.deepcopy(TRAINER)]}})
    spec.setdefault("metricsPort", METRICS_PORT)
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": template, **spec},
    }
